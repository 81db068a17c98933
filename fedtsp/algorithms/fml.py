"""FML (Shen et al., "Federated Mutual Learning", arXiv 2006.16765, 2020).

Every client trains its personal model and its copy of a small shared "meme" model together
by deep mutual learning: personal loss ``alpha * CE + (1 - alpha) * KL(p_meme || p_personal)``,
meme loss ``beta * CE + (1 - beta) * KL(p_personal || p_meme)`` (options ``personal_alpha``,
``meme_beta``). Only the meme model is uploaded; the server averages it (FedAvg) and
broadcasts the average, which every client loads in place; evaluation uses the personal model.

Defaults are those of the runs behind the paper's Table 1 (the FedTSP authors' fork of
HtFLlib with their script's alpha = beta = 0.5): the meme models are averaged uniformly
(``weighting="uniform"``; the paper weights by train sizes, ``"samples"``); the KL terms are
``nn.KLDivLoss()``'s element-wise mean, i.e. the KL per sample divided by the number of
classes (``kl_reduction="mean"``; the per-sample KL is ``"batchmean"``); each model's gradient
norm is clipped at 10 before every step (``grad_clip``; none: the paper, which does not
clip); and each KL term's gradient also flows into the model whose prediction is its target
(``detach_partner=False``: the fork back-propagates both losses through both models; true:
each model learns from the other's prediction as a fixed target, as the paper's deep mutual
learning updates each model on its own loss). The shared model is the family's first
architecture, as in the fork (see ``shared_model``). Floating-point buffers (BatchNorm
statistics) of the meme model are averaged with its parameters; the fork averages parameters
only, which changes no result: the meme model runs only in training mode, on batch statistics.

Revision 1 (run keys): the defaults were ``weighting="samples"``, ``kl_reduction="batchmean"``
and no clipping. Revision 2 (run keys): the targets were detached (``detach_partner=True``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from fedtsp.aggregation import check_weighting, fedavg
from fedtsp.algorithms.base import Algorithm, Message, option, register
from fedtsp.algorithms.shared_model import (
    build_shared_model,
    check_grad_clip,
    check_kl_reduction,
    check_shared_arch,
    class_mean_features,
    client_weights,
    clip_each,
    distill_kl,
    load_shared_weights,
    set_training,
    shared_weights,
    upload_with_count,
)
from fedtsp.clients import Client, ClientFacts
from fedtsp.models.families import ClientModel


@dataclass
class FMLOptions:
    # Named apart from the run's Dirichlet --alpha.
    personal_alpha: float = option(
        0.5, "alpha: personal model's CE weight (1 - alpha: its KL to the meme model)"
    )
    meme_beta: float = option(
        0.5, "beta: meme model's CE weight (1 - beta: its KL to the personal)"
    )
    temperature: float = option(1.0, "softmax temperature of the mutual KL terms (scaled by T^2)")
    kl_reduction: str = option(
        "mean", "KL also per class (mean, authors' code) or per sample (batchmean, paper)"
    )
    weighting: str = option("uniform", "shared-model average: uniform (authors' code) or samples")
    grad_clip: float | None = option(
        10.0, "clip each model's gradient norm (authors' code: 10); none: no clipping (paper)"
    )
    shared_arch: str = option(
        "first", "shared model: first (the family's first architecture, authors' code) or a name"
    )
    detach_partner: bool = option(
        False, "KL target a fixed prediction (true, paper) or trained too (false, authors' code)"
    )

    def validate(self) -> None:
        for name in ("personal_alpha", "meme_beta"):
            value = getattr(self, name)
            if not 0 <= value <= 1:
                raise ValueError(f"{name}={value} is invalid; must be in [0, 1]")
        if not self.temperature > 0:
            raise ValueError(f"temperature={self.temperature} is invalid; must be > 0")
        check_kl_reduction(self.kl_reduction)
        check_weighting(self.weighting)
        check_shared_arch(self.shared_arch)
        check_grad_clip(self.grad_clip)


@dataclass
class FMLState:
    shared: ClientModel  # the meme model: this client's copy of the one shared model


@register
class FML(Algorithm):
    name = "fml"
    Options = FMLOptions
    State = FMLState
    revision = 2

    def init_client(self, client: Client) -> FMLState:
        return FMLState(build_shared_model(self.ctx, self.opts.shared_arch, client.facts()))

    def setup(self, facts: list[ClientFacts], uploads: dict[int, Message]) -> None:
        # Every copy starts identical (built under one seed); nothing to send.
        template = build_shared_model(self.ctx, self.opts.shared_arch, facts[0])
        self.keys = list(shared_weights(template))

    def client_parameters(self, client: Client) -> list[torch.nn.Parameter]:
        return [*client.model.parameters(), *client.state.shared.parameters()]

    def train_loss(self, client: Client, x: Tensor, y: Tensor) -> Tensor:
        o = self.opts
        a, b, t, red = o.personal_alpha, o.meme_beta, o.temperature, o.kl_reduction
        meme = client.state.shared
        set_training(meme, True)
        personal_logits = client.model(x)
        meme_logits = meme(x)
        # One backward pass through the sum gives each model the gradient of both losses, as
        # the fork's two backward calls do; detached targets give each only its own loss's.
        meme_target, personal_target = meme_logits, personal_logits
        if o.detach_partner:
            meme_target, personal_target = meme_logits.detach(), personal_logits.detach()
        kl_personal = distill_kl(personal_logits, meme_target, t, red)
        kl_meme = distill_kl(meme_logits, personal_target, t, red)
        personal = a * F.cross_entropy(personal_logits, y) + (1 - a) * kl_personal
        shared = b * F.cross_entropy(meme_logits, y) + (1 - b) * kl_meme
        return personal + shared

    def before_step(self, client: Client) -> None:
        clip_each([client.model, client.state.shared], self.opts.grad_clip)

    def upload(self, client: Client) -> Message:
        return upload_with_count(client, shared_weights(client.state.shared), self.opts.weighting)

    def server_step(self, uploads: list[Message], round_index: int) -> Message:
        weights = client_weights(uploads, self.opts.weighting)
        return fedavg(uploads, weights, self.keys)

    def receive(self, client: Client, broadcast: Message) -> None:
        load_shared_weights(client.state.shared, broadcast)

    def analysis_artifacts(self, clients: list[Client]) -> dict[str, Tensor]:
        # The meme model is one global model: its class-mean features over all clients' data
        # are the run's global class prototypes.
        return {"global_prototypes": class_mean_features(clients[0].state.shared, clients)}

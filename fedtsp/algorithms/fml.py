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

import torch.nn.functional as F
from torch import Tensor

from fedtsp.algorithms.base import Algorithm, register
from fedtsp.algorithms.clients import Client
from fedtsp.algorithms.shared_model import (
    KL_REDUCTIONS,
    SharedModelClient,
    SharedModelOptions,
    SharedModelServer,
    distill_kl,
    set_training,
)
from fedtsp.core.options import option
from fedtsp.models.families import ClientModel


@dataclass
class FMLOptions(SharedModelOptions):
    # Named apart from the run's Dirichlet --alpha.
    personal_alpha: float = option(
        0.5, "alpha: personal model's CE weight (1 - alpha: its KL to the meme model)", "[0, 1]"
    )
    meme_beta: float = option(
        0.5, "beta: meme model's CE weight (1 - beta: its KL to the personal)", "[0, 1]"
    )
    temperature: float = option(
        1.0, "softmax temperature of the mutual KL terms (scaled by T^2)", "> 0"
    )
    kl_reduction: str = option(
        "mean",
        "KL also per class (mean, authors' code) or per sample (batchmean, paper)",
        choices=KL_REDUCTIONS,
    )
    detach_partner: bool = option(
        False, "KL target a fixed prediction (true, paper) or trained too (false, authors' code)"
    )


@dataclass
class FMLState:
    shared: ClientModel  # the meme model: this client's copy of the one shared model


class FMLClient(SharedModelClient):
    State = FMLState

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


FML = register(Algorithm("fml", FMLClient, SharedModelServer, FMLOptions, revision=2))

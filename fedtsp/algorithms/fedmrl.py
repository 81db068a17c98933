"""FedMRL (Yi et al., "Federated Model Heterogeneous Matryoshka Representation Learning",
NeurIPS 2024).

Each client concatenates the ``sub_dim``-wide representation of a small shared extractor with
its own d-wide representation and maps the concatenation with a personal linear projector
(``sub_dim + d -> d``) to a fused representation; its first ``sub_dim`` entries (the coarse
Matryoshka representation) feed the shared head ``Linear(sub_dim, C)`` and all d entries (the
fine one) feed the personal head, and the loss is the sum of the two cross-entropies. Only the
shared model (extractor + head) is uploaded and averaged (FedAvg); projector, personal
extractor and personal head stay on the client.

Evaluation, precisely: ``personal_head(projector(concat(shared_features(x),
personal_features(x))))``, the fine path through the personal head, as in the authors' code;
the shared head's output is not used. The shared extractor is the family's first architecture
(see ``shared_model``) whose flattened output is average-pooled to ``sub_dim`` entries (the
authors' code builds it the same way, ``BaseHeadSplit(args, 0, sub_feature_dim)``).

Defaults are those of the runs behind the paper's Table 1 (the FedTSP authors' fork of
HtFLlib with their script's sub-feature dim 128): the shared models are averaged uniformly
(``weighting="uniform"``; the paper weights by train size); each model's gradient norm is
clipped at 10 before every step (``grad_clip``; none: the paper); the trained projector is
never saved, so every round, evaluation included, starts from the client's initial random
projector (``projector="reset"``; ``"kept"``: the paper's method); and the shared model is
never switched to evaluation mode, so its batch norm uses test-batch statistics at test time
(``test_batch_stats``). Every client's projector starts from one seeded draw
(``projector_init="shared"``: the fork reseeds torch before each client's projector;
``"independent"``: a draw per client), so the shared head, averaged over clients, reads the
coarse entries through one projection at the start of every round. Floating-point buffers
(BatchNorm statistics) are averaged with the shared parameters; the fork averages parameters
only.

Revision 1 (run keys): the defaults were ``weighting="samples"``, no clipping, the projector
kept and the shared model in evaluation mode at test time. Revision 2: the projectors started
independently (``projector_init="independent"``).

No ``global_prototypes`` artifact: the only global component is an extractor whose output is
fused with personal features by a personal projector before any classifier sees it, so there is
no global class representation to save.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedtsp.algorithms.base import Algorithm, Message, register
from fedtsp.algorithms.clients import Client
from fedtsp.algorithms.shared_model import (
    SharedModelClient,
    SharedModelHalf,
    SharedModelOptions,
    SharedModelServer,
    nth_draw,
    set_training,
)
from fedtsp.core.options import option
from fedtsp.models.families import ClientModel


@dataclass
class FedMRLOptions(SharedModelOptions):
    sub_dim: int = option(
        128,
        "width of the shared representation and of the coarse Matryoshka representation",
        ">= 1",
    )
    projector: str = option(
        "reset",
        "reset (initial projector every round, authors' code) or kept (paper)",
        choices=("reset", "kept"),
    )
    test_batch_stats: bool = option(
        True, "shared model's batch norm on test-batch statistics (authors' code); false: eval"
    )
    projector_init: str = option(
        "shared",
        "projectors from one draw (shared, authors' code) or a draw each (independent)",
        choices=("shared", "independent"),
    )


@dataclass
class FedMRLState:
    shared: ClientModel  # this client's copy of the shared model (sub_dim wide)
    proj: nn.Linear  # fuses the shared and the personal representation
    proj_init: dict[str, Tensor] | None  # projector="reset": where it restarts each round


class FedMRLHalf(SharedModelHalf):
    """Both halves: a shared model ``sub_dim`` wide, which the fused width must hold."""

    def shared_width(self) -> int:
        d, sub = self.ctx.feature_dim, self.opts.sub_dim
        if sub > d:
            raise ValueError(
                f"sub_dim={sub} is invalid; the coarse representation cannot be wider than the "
                f"fused one (feature_dim={d})"
            )
        return sub


class FedMRLClient(FedMRLHalf, SharedModelClient):
    State = FedMRLState

    def init_client(self, client: Client) -> FedMRLState:
        shared = self.new_shared_model(client.facts())  # checks the width first
        d, sub = self.ctx.feature_dim, self.opts.sub_dim
        # shared: every client's projector is the stream's first draw; independent: its own.
        n = client.index if self.opts.projector_init == "independent" else 0
        proj = nth_draw(self.ctx, 0x9207, n, lambda: nn.Linear(sub + d, d)).to(self.ctx.device)
        reset = copy.deepcopy(proj.state_dict()) if self.opts.projector == "reset" else None
        return FedMRLState(shared, proj, reset)

    def client_parameters(self, client: Client) -> list[torch.nn.Parameter]:
        personal, proj = client.model.parameters(), client.state.proj.parameters()
        return [*personal, *proj, *client.state.shared.parameters()]

    def _fused(self, client: Client, x: Tensor) -> Tensor:
        shared_rep = client.state.shared.features(x)  # generalised, sub_dim wide
        personal_rep = client.model.features(x)  # personalised, d wide
        return client.state.proj(torch.cat([shared_rep, personal_rep], dim=1))

    def train_loss(self, client: Client, x: Tensor, y: Tensor) -> Tensor:
        shared = client.state.shared
        set_training(shared, True)
        fused = self._fused(client, x)
        coarse_logits = shared.head(fused[:, : self.opts.sub_dim])
        fine_logits = client.model.head(fused)
        return F.cross_entropy(coarse_logits, y) + F.cross_entropy(fine_logits, y)

    def predict(self, client: Client, x: Tensor) -> Tensor:
        set_training(client.state.shared, self.opts.test_batch_stats)
        return client.model.head(self._fused(client, x))

    def upload(self, client: Client) -> Message:
        if self.opts.projector == "reset":  # the trained projector is dropped (never saved)
            with torch.no_grad():  # in place: the client's optimiser holds these parameters
                for name, value in client.state.proj.state_dict().items():
                    value.copy_(client.state.proj_init[name])
        return super().upload(client)

    def analysis_artifacts(self, clients: list[Client]) -> dict[str, Tensor]:
        return {}  # no global class representation (see the module docstring)


class FedMRLServer(FedMRLHalf, SharedModelServer):
    """FedAvg of the shared models (their names from a ``sub_dim``-wide one)."""


FedMRL = register(Algorithm("fedmrl", FedMRLClient, FedMRLServer, FedMRLOptions, revision=2))

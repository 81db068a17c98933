"""FedProto (Tan et al., AAAI 2022): federated prototype learning.

Clients upload their class-mean features; the server averages them per class into global
prototypes; clients add ``lam * MSE(f(x), P_y)`` to their cross-entropy.

Defaults are those of the runs behind the paper's Table 1 (the authors' fork of HtFLlib,
lambda = 1 from their script): the class means are collected from the training forward
passes of all local epochs (``prototype_source="training"``; the paper's own Algorithm 1 runs
a pass after training, ``"pass"``), averaged unweighted over the clients holding the class
(``weighting="uniform"``; the paper weights by sample counts, ``"samples"``), and every client
is evaluated through its own head, as the fork does. Upstream HtFLlib classifies by the
nearest global prototype instead (``eval_mode="prototype"``).

Revision 1 (run keys): the defaults were ``weighting="samples"``, ``prototype_source="pass"``.
Revision 2: with ``prototype_source="training"`` a class met only in dropped partial batches
was uploaded as a zero vector and averaged in; it is now left out.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from fedtsp.algorithms.aggregation import WEIGHTINGS, aggregate_prototypes
from fedtsp.algorithms.base import Algorithm, ClassTargets, Message, register
from fedtsp.algorithms.clients import PROTOTYPE_SOURCES, Client, ClientFacts
from fedtsp.algorithms.options import option

EVAL_MODES = ("head", "prototype")


@dataclass
class FedProtoOptions:
    lam: float = option(1.0, "weight of the MSE pull towards the global prototype", ">= 0")
    weighting: str = option(
        "uniform", "prototype average: uniform (authors' code) or samples", choices=WEIGHTINGS
    )
    eval_mode: str = option(
        "head", "head (authors' code) or prototype (nearest, HtFLlib)", choices=EVAL_MODES
    )
    prototype_source: str = option(
        "training",
        "client prototypes: training (forward passes, authors' code) or pass",
        choices=PROTOTYPE_SOURCES,
    )


def nearest_prototype_logits(
    client: Client, x: Tensor, protos: Tensor, present: Tensor | None = None
) -> Tensor:
    """-||f(x) - P_c|| per class (HtFLlib's prototype evaluation); absent classes get -inf."""
    dist = torch.cdist(client.model.features(x).float(), protos.float())
    return -dist if present is None else (-dist).masked_fill(~present, float("-inf"))


@register
class FedProto(Algorithm):
    name = "fedproto"
    Options = FedProtoOptions
    State = ClassTargets
    revision = 2
    server_state = ("global_protos",)

    def setup(self, facts: list[ClientFacts], uploads: dict[int, Message]) -> None:
        self.global_protos: Tensor | None = None

    def local_loss(
        self, client: Client, x: Tensor, y: Tensor, feats: Tensor, logits: Tensor
    ) -> Tensor | None:
        if self.opts.prototype_source == "training":
            client.record_class_sums(feats, y)
        protos, present = client.state.targets, client.state.present
        if protos is None or self.opts.lam == 0:
            return None
        # Samples of classes without a global prototype are pulled towards themselves (0).
        target = torch.where(present[y].unsqueeze(1), protos[y], feats.detach())
        return self.opts.lam * F.mse_loss(feats, target.to(feats.dtype))

    def predict(self, client: Client, x: Tensor) -> Tensor:
        protos = client.state.targets
        if self.opts.eval_mode == "head" or protos is None:
            return client.model(x)
        return nearest_prototype_logits(client, x, protos, client.state.present)

    def upload(self, client: Client) -> Message:
        means, counts = client.prototypes(self.opts.prototype_source)
        return {"protos": means, "counts": counts}

    def server_step(self, uploads: list[Message], round_index: int) -> Message:
        protos, present = aggregate_prototypes(
            [u["protos"] for u in uploads], [u["counts"] for u in uploads], self.opts.weighting
        )
        self.global_protos = protos
        return {"protos": protos, "present": present}

    def receive(self, client: Client, broadcast: Message) -> None:
        client.state.take(broadcast, "protos", "present", client.device)

    def artifacts(self) -> dict[str, Tensor]:
        protos = self.global_protos
        return {} if protos is None else {"global_prototypes": protos}

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

from fedtsp.algorithms.aggregation import WEIGHTINGS
from fedtsp.algorithms.base import (
    Algorithm,
    register,
)
from fedtsp.algorithms.clients import PROTOTYPE_SOURCES, Client
from fedtsp.algorithms.prototypes import (
    EVAL_MODES,
    PrototypeAverage,
    PrototypeClient,
    nearest_prototype_logits,
)
from fedtsp.core.options import option


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


class FedProtoClient(PrototypeClient):
    def pull(self, client: Client, y: Tensor, feats: Tensor) -> Tensor:
        state = client.state
        # Samples of classes without a global prototype are pulled towards themselves (0).
        target = torch.where(state.present[y].unsqueeze(1), state.targets[y], feats.detach())
        return F.mse_loss(feats, target.to(feats.dtype))

    def predict(self, client: Client, x: Tensor) -> Tensor:
        protos = client.state.targets
        if self.opts.eval_mode == "head" or protos is None:
            return client.model(x)
        return nearest_prototype_logits(client, x, protos, client.state.present)


FedProto = register(
    Algorithm("fedproto", FedProtoClient, PrototypeAverage, FedProtoOptions, revision=2)
)

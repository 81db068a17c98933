"""FedDistill (Jeong et al., "Communication-Efficient On-Device Machine Learning: Federated
Distillation and Augmentation under Non-IID Private Data", NeurIPS 2018 workshop): federated
distillation through per-class mean logits.

Every client uploads its per-class mean logits and its class counts; the server averages
them per class over the clients holding the class, and clients add a distillation term
towards the global logits of each sample's class. Heads stay personal. Samples of a class no
client holds, and every sample before the first aggregation, get no distillation term.

Defaults are those of the runs behind the paper's Table 1 (the FedTSP authors' fork of
HtFLlib with their script's lambda = 1): the class logits are averaged over the training
forward passes of all local epochs (``logit_source="training"``; ``"pass"``: one pass with
the trained model), the server's mean is unweighted (``weighting="uniform"``; ``"samples"``
weights by class counts), and the term is ``lam * CE(logits, softmax(G_y))``
(``distill_loss="soft_ce"``). Upstream HtFLlib used ``lam * MSE(logits, G_y)`` (``"mse"``)
until it switched, in November 2025, to a cross-entropy towards the raw logits.

Revision 1 (run keys): the defaults were ``"pass"``, ``"samples"`` and ``"mse"``.
Revision 2: with ``logit_source="training"`` a class met only in dropped partial batches was
uploaded as zero logits and averaged in; it is now left out.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from fedtsp.algorithms.aggregation import WEIGHTINGS
from fedtsp.algorithms.base import (
    Algorithm,
    ClassTargets,
    ClientHalf,
    Message,
    register,
)
from fedtsp.algorithms.clients import PROTOTYPE_SOURCES, Client
from fedtsp.algorithms.prototypes import PrototypeAverage
from fedtsp.core.options import option


@dataclass
class FedDistillOptions:
    lam: float = option(1.0, "weight of the distillation towards the global class logits", ">= 0")
    weighting: str = option(
        "uniform",
        "per-class logit average: uniform (authors' code) or samples (class counts)",
        choices=WEIGHTINGS,
    )
    distill_loss: str = option(
        "soft_ce",
        "soft_ce (CE to softmax of the global logits, authors' code) or mse",
        choices=("mse", "soft_ce"),
    )
    logit_source: str = option(
        "training",
        "class logits: training (forward passes, authors' code) or pass",
        choices=PROTOTYPE_SOURCES,
    )


class FedDistillClient(ClientHalf):
    State = ClassTargets

    def local_loss(
        self, client: Client, x: Tensor, y: Tensor, feats: Tensor, logits: Tensor
    ) -> Tensor | None:
        if self.opts.logit_source == "training":
            client.record_class_sums(logits, y)
        state = client.state
        if not state.pulls(self.opts.lam):
            return None
        # A sample whose class has no global logits is its own target: zero gradient.
        own = logits.detach().float()
        target = torch.where(state.present[y].unsqueeze(1), state.targets[y], own)
        if self.opts.distill_loss == "mse":
            return self.opts.lam * F.mse_loss(logits.float(), target)
        return self.opts.lam * F.cross_entropy(logits.float(), target.softmax(dim=1))

    def upload(self, client: Client) -> Message:
        if self.opts.logit_source == "training":
            means, counts = client.prototypes("training", width=client.num_classes)
        else:
            means, counts = client.class_prototypes(client.model)  # per-class mean logits
        return {"logits": means, "counts": counts}

    def receive(self, client: Client, message: Message) -> None:
        client.state.take(message, "logits", "present", client.device)


class FedDistillServer(PrototypeAverage):
    key, artifact = "logits", "global_logits"  # class-mean logits, averaged as prototypes


FedDistill = register(
    Algorithm("feddistill", FedDistillClient, FedDistillServer, FedDistillOptions, revision=2)
)

"""FedPCL (Tan et al., "Federated Learning from Pre-Trained Models: A Contrastive Learning
Approach", NeurIPS 2022), setting pfl.

Clients share only class prototypes. Each client trains its own model with prototype-wise
contrastive learning: the L2-normalised feature of a sample is classified against the global
prototypes and against the client's own prototypes by cosine similarity / ``tau``

    loss = CE(cos(f(x), G) / tau, y) + CE(cos(f(x), L_i) / tau, y)

and predicts the class of the most similar global prototype. The server averages the
clients' class-mean features (sample-weighted) into G; L_i are client i's own class means
from its last upload. Round 0, before any prototype exists, trains with the head's
cross-entropy so that the first prototypes mean something.

Departure: the paper learns a small projection over several *frozen pre-trained* backbones;
none is available offline here and the model-homogeneous setting trains one model per client
from scratch, so the whole client model plays the projection's role (as in PFLlib's FedPCL).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch.nn.functional as F
from torch import Tensor

from fedtsp.algorithms.aggregation import WEIGHTINGS
from fedtsp.algorithms.base import Algorithm, ClassTargets, ClientHalf, Message, register
from fedtsp.algorithms.clients import Client
from fedtsp.algorithms.prototypes import PrototypeAverage
from fedtsp.core.options import option


@dataclass
class FedPCLOptions:
    tau: float = option(0.07, "temperature of the prototype-wise contrastive loss", "> 0")
    weighting: str = option(
        "samples", "prototype average: samples (paper) or uniform", choices=WEIGHTINGS
    )


def prototype_logits(feats: Tensor, protos: Tensor, present: Tensor, tau: float) -> Tensor:
    """cos(f, P_c) / tau for every class; classes without a prototype get -inf."""
    sims = F.normalize(feats.float(), dim=1) @ F.normalize(protos, dim=1).T / tau
    return sims.masked_fill(~present.unsqueeze(0), float("-inf"))


@dataclass
class FedPCLState(ClassTargets):
    own_targets: Tensor | None = None  # L_i: this client's class means of its last upload
    own_present: Tensor | None = None


class FedPCLClient(ClientHalf):
    State = FedPCLState

    def train_loss(self, client: Client, x: Tensor, y: Tensor) -> Tensor:
        feats = client.model.features(x)
        state = client.state
        if state.targets is None:
            return F.cross_entropy(client.model.head(feats), y)
        tau, loss = self.opts.tau, feats.new_zeros(())
        global_and_own = ((state.targets, state.present), (state.own_targets, state.own_present))
        for protos, present in global_and_own:
            known = present[y]  # a class without a prototype cannot be a target
            if bool(known.any()):
                logits = prototype_logits(feats[known], protos, present, tau)
                loss = loss + F.cross_entropy(logits, y[known])
        return loss

    def predict(self, client: Client, x: Tensor) -> Tensor:
        protos, present = client.state.targets, client.state.present
        if protos is None:
            return client.model(x)
        # Finite logits for the evaluation's loss: absent classes get a very low score.
        return prototype_logits(client.model.features(x), protos, present, 1.0).clamp(min=-1e4)

    def upload(self, client: Client) -> Message:
        means, counts = client.class_prototypes()  # a pass after training
        message = {"protos": means, "counts": counts}
        client.state.own_targets, client.state.own_present = means, counts > 0
        return message

    def receive(self, client: Client, message: Message) -> None:
        client.state.take(message, "protos", "present", client.device)


# FedProto's server (class-wise prototype average) with FedPCL's contrastive client side.
FedPCL = register(
    Algorithm("fedpcl", FedPCLClient, PrototypeAverage, FedPCLOptions, settings=("pfl",))
)

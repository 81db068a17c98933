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

from fedtsp.aggregation import aggregate_prototypes
from fedtsp.algorithms.base import Algorithm, Message, option, register
from fedtsp.clients import Client


@dataclass
class FedPCLOptions:
    tau: float = option(0.07, "temperature of the prototype-wise contrastive loss")

    def validate(self) -> None:
        if not self.tau > 0:
            raise ValueError(f"tau={self.tau} is invalid; must be > 0")


def prototype_logits(feats: Tensor, protos: Tensor, present: Tensor, tau: float) -> Tensor:
    """cos(f, P_c) / tau for every class; classes without a prototype get -inf."""
    sims = F.normalize(feats.float(), dim=1) @ F.normalize(protos, dim=1).T / tau
    return sims.masked_fill(~present.unsqueeze(0), float("-inf"))


@register
class FedPCL(Algorithm):
    name = "fedpcl"
    Options = FedPCLOptions
    settings = ("pfl",)

    def train_loss(self, client: Client, x: Tensor, y: Tensor) -> Tensor:
        feats = client.model.features(x)
        if "global_protos" not in client.state:
            return F.cross_entropy(client.model.head(feats), y)
        tau, loss = self.opts.tau, feats.new_zeros(())
        for key in ("global", "local"):
            protos, present = client.state[f"{key}_protos"], client.state[f"{key}_present"]
            known = present[y]  # a class without a prototype cannot be a target
            if bool(known.any()):
                logits = prototype_logits(feats[known], protos, present, tau)
                loss = loss + F.cross_entropy(logits, y[known])
        return loss

    def predict(self, client: Client, x: Tensor) -> Tensor:
        if "global_protos" not in client.state:
            return client.model(x)
        protos, present = client.state["global_protos"], client.state["global_present"]
        # Finite logits for the evaluation's loss: absent classes get a very low score.
        return prototype_logits(client.model.features(x), protos, present, 1.0).clamp(min=-1e4)

    def upload(self, client: Client) -> Message:
        means, counts = client.class_prototypes()
        client.state["local_protos"], client.state["local_present"] = means, counts > 0
        return {"protos": means, "counts": counts}

    def server_step(self, uploads: list[Message], round_index: int) -> Message:
        protos, present = aggregate_prototypes(
            [u["protos"] for u in uploads], [u["counts"] for u in uploads], "samples"
        )
        self.global_protos = protos
        return {"protos": protos, "present": present}

    def receive(self, client: Client, broadcast: Message) -> None:
        client.state["global_protos"] = broadcast["protos"].to(client.device)
        client.state["global_present"] = broadcast["present"].to(client.device)

    def artifacts(self) -> dict[str, Tensor]:
        protos = getattr(self, "global_protos", None)
        return {} if protos is None else {"global_prototypes": protos}

    def state_dict(self) -> dict:
        return {"global_protos": getattr(self, "global_protos", None)}

    def load_state_dict(self, state: dict) -> None:
        self.global_protos = state["global_protos"]

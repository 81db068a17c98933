"""LG-FedAvg (Liang et al., "Think Locally, Act Globally: Federated Learning with Local and
Global Representations", NeurIPS 2019 FL workshop / arXiv 2020): only the heads are federated.

Clients upload their linear head (weight and bias) and train-set size; the server averages
the heads weighted by sample count (FedAvg) and every client replaces its head with the
average, while each feature extractor stays local. As in the authors' HtFLlib fork, all heads
start from client 0's initial head (the server's first broadcast). Departure from the paper:
the paper's local part is the lower layers of one shared architecture; in the heterogeneous
setting only the common linear head can be averaged, which is HtFLlib's form.
"""

from __future__ import annotations

import torch
from torch import Tensor

from fedtsp.aggregation import fedavg, normalized_weights
from fedtsp.algorithms.base import Algorithm, Message, register
from fedtsp.algorithms.model_messages import message_head
from fedtsp.clients import Client, ClientFacts


@register
class LGFedAvg(Algorithm):
    name = "lg-fedavg"
    start_from = "head"  # one common starting head, as the authors' server sends in round 0

    def setup(self, facts: list[ClientFacts], uploads: dict[int, Message]) -> Message:
        weight, bias = message_head(uploads[0])
        self.global_head = {"weight": weight.float(), "bias": bias.float()}
        return self._broadcast()

    def _broadcast(self) -> Message:
        return {"head_weight": self.global_head["weight"], "head_bias": self.global_head["bias"]}

    def upload(self, client: Client) -> Message:
        head = client.model.head
        return {
            "head_weight": head.weight.detach().float(),
            "head_bias": head.bias.detach().float(),
            "num_samples": torch.tensor(client.num_train, dtype=torch.int64),
        }

    def server_step(self, uploads: list[Message], round_index: int) -> Message:
        self.global_head = average_heads(
            torch.stack([u["num_samples"] for u in uploads]),
            torch.stack([u["head_weight"] for u in uploads]),
            torch.stack([u["head_bias"] for u in uploads]),
        )
        return self._broadcast()

    def receive(self, client: Client, broadcast: Message) -> None:
        load_head(client, broadcast["head_weight"], broadcast["head_bias"])

    def artifacts(self) -> dict[str, Tensor]:
        return {
            "global_head": self.global_head["weight"],
            "global_head_bias": self.global_head["bias"],
        }

    def state_dict(self) -> dict:
        return {"global_head": self.global_head}

    def load_state_dict(self, state: dict) -> None:
        self.global_head = state["global_head"]


def average_heads(sizes: Tensor, weight: Tensor, bias: Tensor) -> dict[str, Tensor]:
    """Sample-weighted mean (FedAvg) of K heads: ``weight`` (K, C, d), ``bias`` (K, C)."""
    heads = [{"weight": w, "bias": b} for w, b in zip(weight, bias, strict=True)]
    return fedavg(heads, normalized_weights(sizes.tolist()))


@torch.no_grad()
def load_head(client: Client, weight: Tensor, bias: Tensor) -> None:
    """Overwrite the client's head in place (its optimiser keeps the same parameter objects)."""
    head = client.model.head
    head.weight.copy_(weight.to(head.weight.device, head.weight.dtype))
    head.bias.copy_(bias.to(head.bias.device, head.bias.dtype))

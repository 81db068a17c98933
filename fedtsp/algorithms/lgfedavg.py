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

from torch import Tensor

from fedtsp.algorithms.base import Algorithm, ClientHalf, Message, ServerHalf, register
from fedtsp.algorithms.clients import Client, ClientFacts
from fedtsp.algorithms.model_messages import (
    average_model_messages,
    head_message,
    load_model_message,
    message_head,
    with_sample_count,
)


class LGFedAvgClient(ClientHalf):
    start_from = "head"  # one common starting head, as the authors' server sends in round 0

    def upload(self, client: Client) -> Message:
        return with_sample_count(client, head_message(client.model))

    def receive(self, client: Client, message: Message) -> None:
        load_model_message(client.model, message)


class LGFedAvgServer(ServerHalf):
    server_state = ("global_head",)

    def setup(self, facts: list[ClientFacts], uploads: dict[int, Message]) -> Message:
        self.global_head = uploads[0]
        return self.global_head

    def aggregate(self, round_index: int, uploads: dict[int, Message]) -> None:
        self.global_head = average_model_messages(list(uploads.values()))

    def message(self) -> Message:
        return self.global_head

    def artifacts(self) -> dict[str, Tensor]:
        weight, bias = message_head(self.global_head)
        return {"global_head": weight, "global_head_bias": bias}


LGFedAvg = register(Algorithm("lg-fedavg", LGFedAvgClient, LGFedAvgServer))

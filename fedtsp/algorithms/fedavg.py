"""FedAvg (McMahan et al., "Communication-Efficient Learning of Deep Networks from
Decentralized Data", AISTATS 2017): every client trains the whole model, the server averages
all weights, sample-weighted, and every client continues from the average.

Model-homogeneous settings only (``gfl``). All clients start from one model (the server's
first broadcast is client 0's initial weights, as a FedAvg server sends its global model in
round 0). The floating-point state is averaged, BatchNorm running statistics included, with
the one rule every averaging method shares (``fedtsp.algorithms.aggregation.fedavg``); BatchNorm's
integer batch counter stays local.

A model travels as ``"model.<state key>"`` entries (``fedtsp.algorithms.model_messages``).
"""

from __future__ import annotations

from fedtsp.algorithms.base import Algorithm, Message, register
from fedtsp.algorithms.clients import Client, ClientFacts
from fedtsp.algorithms.model_messages import (
    average_model_messages,
    load_model_message,
    model_message,
    with_sample_count,
)


@register
class FedAvg(Algorithm):
    name = "fedavg"
    settings = ("gfl",)
    start_from = "model"

    def shares(self, key: str) -> bool:
        """Which state entries are federated (subclasses keep e.g. the head out)."""
        return True

    def setup(self, facts: list[ClientFacts], uploads: dict[int, Message]) -> Message:
        # One common starting model for everyone, all of it (unshared parts too, e.g.
        # FedBABU's frozen head): client 0's initial weights.
        return dict(uploads[0])

    def upload(self, client: Client) -> Message:
        return with_sample_count(client, model_message(client.model, self.shares))

    def server_step(self, uploads: list[Message], round_index: int) -> Message:
        return average_model_messages(uploads)

    def receive(self, client: Client, broadcast: Message) -> None:
        load_model_message(client.model, broadcast)

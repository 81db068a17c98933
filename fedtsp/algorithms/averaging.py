"""Whole-model averaging, the halves of FedAvg that FedBABU, FedFA and FedETF extend: every
client uploads its model's federated entries with its sample count, the server averages them
sample-weighted (``model_messages.average_model_messages``) and every client loads the
average. The first message is client 0's initial model, all of it."""

from __future__ import annotations

from fedtsp.algorithms.base import ClientHalf, Message, ServerHalf
from fedtsp.algorithms.clients import Client, ClientFacts
from fedtsp.algorithms.model_messages import (
    average_model_messages,
    load_model_message,
    model_message,
    with_sample_count,
)


class FedAvgClient(ClientHalf):
    start_from = "model"

    def shares(self, key: str) -> bool:
        """Which state entries are federated (subclasses keep e.g. the head out)."""
        return True

    def upload(self, client: Client) -> Message:
        return with_sample_count(client, model_message(client.model, self.shares))

    def receive(self, client: Client, message: Message) -> None:
        load_model_message(client.model, message)


class FedAvgServer(ServerHalf):
    def setup(self, facts: list[ClientFacts], uploads: dict[int, Message]) -> Message:
        # One common starting model for everyone, all of it (unshared parts too, e.g.
        # FedBABU's frozen head): client 0's initial weights.
        return dict(uploads[0])

    def aggregate(self, round_index: int, uploads: dict[int, Message]) -> None:
        self.average = average_model_messages(list(uploads.values()))

    def message(self) -> Message:
        return self.average

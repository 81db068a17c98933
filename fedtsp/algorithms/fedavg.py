"""FedAvg (McMahan et al., "Communication-Efficient Learning of Deep Networks from
Decentralized Data", AISTATS 2017): every client trains the whole model, the server averages
all weights, sample-weighted, and every client continues from the average.

Model-homogeneous settings only (``gfl``). All clients start from one model (the server's
first broadcast is client 0's initial weights, as a FedAvg server sends its global model in
round 0). The floating-point state is averaged, BatchNorm running statistics included, with
the one rule every averaging method shares (``fedtsp.aggregation.fedavg``); BatchNorm's
integer batch counter stays local.

This module also holds the whole-model message helpers that FedBABU, FedETF, FedFA and
FedTSP in the homogeneous settings reuse: a model travels as ``"model.<state key>"`` entries
of a message next to the method's own entries.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor, nn

from fedtsp.aggregation import fedavg, normalized_weights
from fedtsp.algorithms.base import Algorithm, Message, register
from fedtsp.algorithms.shared_model import SAMPLES_KEY, load_shared_weights, shared_weights
from fedtsp.clients import Client

MODEL_PREFIX = "model."


def model_message(
    model: nn.Module, keep: Callable[[str], bool] = lambda key: True
) -> dict[str, Tensor]:
    """The model's floating-point state (those keys ``keep`` accepts) as message entries."""
    return {MODEL_PREFIX + k: v for k, v in shared_weights(model).items() if keep(k)}


def load_model_message(model: nn.Module, message: Message) -> None:
    """Copy every ``model.*`` entry of ``message`` into ``model`` in place."""
    n = len(MODEL_PREFIX)
    load_shared_weights(model, {k[n:]: v for k, v in message.items() if k.startswith(MODEL_PREFIX)})


def with_sample_count(client: Client, message: Message) -> Message:
    """Add the client's train size, the weight of its upload in the sample-weighted mean."""
    return message | {SAMPLES_KEY: torch.tensor(client.num_train, dtype=torch.int64)}


def average_model_messages(uploads: Sequence[Message]) -> dict[str, Tensor]:
    """Sample-weighted FedAvg of the uploads' ``model.*`` entries."""
    weights = normalized_weights([u[SAMPLES_KEY] for u in uploads], "samples")
    keys = [k for k in uploads[0] if k.startswith(MODEL_PREFIX)]
    return fedavg(uploads, weights, keys)


@register
class FedAvg(Algorithm):
    name = "fedavg"
    settings = ("gfl",)

    def shares(self, key: str) -> bool:
        """Which state entries are federated (subclasses keep e.g. the head out)."""
        return True

    def setup(self, clients: list[Client]) -> Message:
        # One common starting model for everyone, all of it (unshared parts too, e.g.
        # FedBABU's frozen head): client 0's initial weights.
        return model_message(clients[0].model)

    def upload(self, client: Client) -> Message:
        return with_sample_count(client, model_message(client.model, self.shares))

    def server_step(self, uploads: list[Message], round_index: int) -> Message:
        return average_model_messages(uploads)

    def receive(self, client: Client, broadcast: Message) -> None:
        load_model_message(client.model, broadcast)

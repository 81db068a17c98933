"""A model (or a part of it) as message entries: ``"model.<state key>"`` tensors, which
FedAvg, the clustered methods and every method that sends a common starting model or head
share, next to their own entries."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from fedtsp.algorithms.aggregation import fedavg, normalized_weights

if TYPE_CHECKING:
    from fedtsp.algorithms.clients import Client

Message = dict[str, Tensor]
MODEL_PREFIX = "model."
HEAD_PREFIX = "head."  # state keys of a model's classifier
HEAD_KEYS = ("model.head.weight", "model.head.bias")
SAMPLES_KEY = "num_samples"  # a client's train size, its weight in a sample-weighted mean


def shared_weights(module: nn.Module) -> dict[str, Tensor]:
    """The floating-point state (parameters and e.g. BatchNorm statistics) as copies.

    Integer buffers (BatchNorm's batch counter) stay local: they are not averaged.
    """
    return {k: v.detach().clone() for k, v in module.state_dict().items() if v.is_floating_point()}


@torch.no_grad()
def load_shared_weights(module: nn.Module, weights: dict[str, Tensor]) -> None:
    """Copy ``weights`` into the module in place (the optimiser holds its parameter objects)."""
    state = module.state_dict()
    for name, value in weights.items():
        state[name].copy_(value)


def model_message(
    model: nn.Module, keep: Callable[[str], bool] = lambda key: True
) -> dict[str, Tensor]:
    """The model's floating-point state (those keys ``keep`` accepts) as message entries."""
    return {MODEL_PREFIX + k: v for k, v in shared_weights(model).items() if keep(k)}


def head_message(model: nn.Module) -> dict[str, Tensor]:
    """The linear head's weight and bias as message entries (``HEAD_KEYS``)."""
    return model_message(model, lambda key: key in ("head.weight", "head.bias"))


def message_head(message: Message) -> tuple[Tensor, Tensor]:
    """(weight, bias) of a head sent with `head_message` (or inside a whole model's)."""
    return message[HEAD_KEYS[0]], message[HEAD_KEYS[1]]


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


@torch.no_grad()
def load_head(client: Client, weight: Tensor, bias: Tensor) -> None:
    """Overwrite the client's head in place (its optimiser keeps the same parameter objects)."""
    head = client.model.head
    head.weight.copy_(weight.to(head.weight.device, head.weight.dtype))
    head.bias.copy_(bias.to(head.bias.device, head.bias.dtype))

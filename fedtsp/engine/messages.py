"""What the engine measures of the messages between a method's two halves."""

from __future__ import annotations

import torch

from fedtsp.algorithms.base import Message


def message_nbytes(message: Message | None) -> int:
    """The bytes a message puts on the wire: its tensors' payload."""
    return sum(t.numel() * t.element_size() for t in (message or {}).values() if torch.is_tensor(t))

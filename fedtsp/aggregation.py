"""Server-side aggregation rules shared by several methods."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import Tensor

WEIGHTINGS = ("samples", "uniform")


def aggregate_prototypes(
    prototypes: Sequence[Tensor], counts: Sequence[Tensor], weighting: str = "samples"
) -> tuple[Tensor, Tensor]:
    """Average per-class prototypes over the clients that hold each class.

    ``prototypes[i]`` is client i's (C, d) class-mean matrix and ``counts[i]`` its (C,)
    sample counts (0 where the client lacks the class). ``weighting="samples"`` weights
    each client by its count of that class (the papers' Eq.); ``"uniform"`` gives every
    client holding the class equal weight (the HtFLlib code). Returns the (C, d) global
    prototypes and a (C,) bool mask of the classes some client holds (other rows are 0).
    """
    if weighting not in WEIGHTINGS:
        raise ValueError(f"weighting={weighting!r} is invalid; choose one of {WEIGHTINGS}")
    protos = torch.stack([p.float() for p in prototypes])  # (N, C, d)
    cnt = torch.stack([c.float() for c in counts]).to(protos.device)  # (N, C)
    weights = cnt if weighting == "samples" else (cnt > 0).float()
    total = weights.sum(0)  # (C,)
    present = total > 0
    summed = (weights.unsqueeze(-1) * protos).sum(0)
    return summed / total.clamp(min=1e-12).unsqueeze(-1), present


def normalized_weights(sizes: Sequence[Tensor | int], weighting: str = "samples") -> Tensor:
    """FedAvg weights summing to 1: proportional to client sizes, or equal (``uniform``)."""
    if weighting not in WEIGHTINGS:
        raise ValueError(f"weighting={weighting!r} is invalid; choose one of {WEIGHTINGS}")
    if weighting == "samples":
        counts = torch.tensor([float(n) for n in sizes], dtype=torch.float64)
    else:
        counts = torch.ones(len(sizes), dtype=torch.float64)
    return counts / counts.sum()


def fedavg(
    states: Sequence[Mapping[str, Tensor]], weights: Tensor, keys: Sequence[str] | None = None
) -> dict[str, Tensor]:
    """``sum_i weights[i] * states[i][k]`` for every key (float32): the one FedAvg rule
    shared by every method that averages parameters."""
    out = {}
    for key in keys if keys is not None else list(states[0]):
        acc = torch.zeros_like(states[0][key], dtype=torch.float32)
        for w, state in zip(weights.tolist(), states, strict=True):
            acc.add_(state[key].to(acc.device).float(), alpha=w)
        out[key] = acc
    return out

"""Server-side aggregation rules shared by several methods."""

from __future__ import annotations

from collections.abc import Sequence

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

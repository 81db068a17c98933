"""Server-side aggregation rules shared by several methods."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import Tensor

WEIGHTINGS = ("samples", "uniform")


def check_weighting(weighting: str) -> None:
    """Raise ValueError unless ``weighting`` is one of WEIGHTINGS (an option every averaging method has)."""
    if weighting not in WEIGHTINGS:
        raise ValueError(f"weighting={weighting!r} is invalid; choose one of {WEIGHTINGS}")


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
    check_weighting(weighting)
    protos = torch.stack([p.float() for p in prototypes])  # (N, C, d)
    cnt = torch.stack([c.float() for c in counts]).to(protos.device)  # (N, C)
    weights = cnt if weighting == "samples" else (cnt > 0).float()
    total = weights.sum(0)  # (C,)
    present = total > 0
    summed = (weights.unsqueeze(-1) * protos).sum(0)
    return summed / total.clamp(min=1e-12).unsqueeze(-1), present


def aggregate_uploads(
    uploads: Mapping[int, Mapping[str, Tensor]], key: str, weighting: str = "samples"
) -> tuple[Tensor, Tensor]:
    """``aggregate_prototypes`` over the clients' ``key`` entries and their ``"counts"``."""
    rows = list(uploads.values())
    return aggregate_prototypes([u[key] for u in rows], [u["counts"] for u in rows], weighting)


def unweighted_class_means(
    uploads: Sequence[Mapping[str, Tensor]], num_classes: int, device: torch.device | str
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Stack uploads of the held classes' prototypes and average them per class, unweighted.

    Each upload holds ``protos`` (one row per class the client holds) and ``present`` (its
    (C,) bool mask); no counts are sent, so every holder of a class counts once. Returns the
    stacked prototypes, their labels, the (C, d) class means (0 for unheld classes) and the
    (C,) number of clients holding each class.
    """
    protos = torch.cat([u["protos"].to(device).float() for u in uploads])
    labels = torch.cat([u["present"].to(device).nonzero().squeeze(1) for u in uploads])
    sums = torch.zeros(num_classes, protos.shape[1], device=device).index_add_(0, labels, protos)
    held = torch.bincount(labels, minlength=num_classes)
    return protos, labels, sums / held.clamp(min=1).unsqueeze(1), held


def normalized_weights(sizes: Sequence[Tensor | int], weighting: str = "samples") -> Tensor:
    """FedAvg weights summing to 1: proportional to client sizes, or equal (``uniform``)."""
    check_weighting(weighting)
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

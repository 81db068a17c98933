"""Floors and ceilings: what an accuracy must beat before it says anything about a method.

On the clients' own test splits (the paper's local accuracy) the floor is not chance: each
split follows its client's Dirichlet label mix, so a client that always answers its most
frequent training class already scores well (CIFAR-10, Dir(0.1): about 70-77 %). That
constant predictor, the **label prior**, needs no training run: it follows from the
partition's class counts, and every accuracy table carries it as a row. On a balanced test
set (the global test set, Table 3's GFL) the floor is chance, 1 / C.

A comparison can only show a method's gain where the better side clears the floor by a
margin at least as large as the effects in question (`FLOOR_MARGIN`), and, for top-k
accuracy, where both sides stay below a ceiling with the same room (`CEILING`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

LABEL_PRIOR = "Label prior"  # the row name in tables
# Points above the floor the better side must reach: the paper's FedTSP gains are 1 to
# 4.5 points, so a setting whose best method is within 5 points of a constant predictor
# has no room to show the largest of them.
FLOOR_MARGIN = 5.0
# Top-k accuracy (%) both sides must stay below: the same 5 points of room under 100.
CEILING = 100.0 - FLOOR_MARGIN


def label_prior(
    train_counts: Sequence[Sequence[int]], test_counts: Sequence[Sequence[int]], k: int = 1
) -> float:
    """Accuracy (%) of every client answering its k most frequent training classes,
    sample-weighted over the clients' test splits as the paper's accuracy is.

    Ties go to the lower class index (what `argsort` with a stable sort picks), so the value
    is a function of the counts alone.
    """
    train = np.asarray(train_counts, dtype=np.int64)
    test = np.asarray(test_counts, dtype=np.int64)
    if train.shape != test.shape or train.ndim != 2:
        raise ValueError(
            f"class counts must be two (clients x classes) tables of one shape; got "
            f"{train.shape} and {test.shape}"
        )
    top = np.argsort(-train, axis=1, kind="stable")[:, :k]
    hits = np.take_along_axis(test, top, axis=1).sum()
    return 100.0 * float(hits) / max(int(test.sum()), 1)


def record_label_prior(record: dict[str, Any], k: int = 1) -> float:
    """The label prior (%) of a run record's partition (NaN for a record without counts)."""
    part = record.get("partition") or {}
    if "train_class_counts" not in part or "test_class_counts" not in part:
        return float("nan")
    return label_prior(part["train_class_counts"], part["test_class_counts"], k)


def chance(num_classes: int, k: int = 1) -> float:
    """Accuracy (%) of a uniform guess of k classes on a balanced test set."""
    return 100.0 * min(k, num_classes) / num_classes

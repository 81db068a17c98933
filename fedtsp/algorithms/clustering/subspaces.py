"""PACFL's client descriptors: data subspaces and the principal angles between them.

Each client sends once the ``rank`` leading left singular vectors of its data matrix
(flattened normalised images as columns), per class (``per_class=True``, as the authors'
code) or for all its data; the union is orthonormalised into one subspace per client. Two
clients' distance is a statistic (mean, min or sum) of the principal angles between their
subspaces: the arccos of the singular values of U_i^T U_j.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

ANGLE_STATISTICS = ("mean", "min", "sum")


def data_subspace(
    images: np.ndarray, labels: np.ndarray | None, rank: int, per_class: bool = True
) -> np.ndarray:
    """Orthonormal basis (D, r) of the span of the leading left singular vectors of the data."""
    raw = np.asarray(images)
    x = raw.reshape(len(raw), -1).astype(np.float64)
    if raw.dtype == np.uint8:  # the same [-1, 1] scaling the models train on
        x = (x / 255.0 - 0.5) / 0.5
    groups = [x] if not per_class or labels is None else [x[labels == c] for c in np.unique(labels)]
    bases = []
    for g in groups:
        u, _, _ = np.linalg.svd(g.T, full_matrices=False)  # columns: samples
        bases.append(u[:, :rank])
    u, s, _ = np.linalg.svd(np.concatenate(bases, axis=1), full_matrices=False)
    return u[:, s > 1e-6 * s.max()]  # orthonormal; directions spanned twice count once


def principal_angles(u1: np.ndarray, u2: np.ndarray) -> np.ndarray:
    """Principal angles (radians, ascending) between the column spans of two orthonormal bases."""
    s = np.linalg.svd(u1.T @ u2, compute_uv=False)
    return np.sort(np.arccos(np.clip(s, -1.0, 1.0)))


def subspace_distances(bases: Sequence[np.ndarray], statistic: str = "mean") -> np.ndarray:
    n = len(bases)
    reduce = {"mean": np.mean, "min": np.min, "sum": np.sum}[statistic]
    d = np.zeros((n, n))
    for i in range(n):
        for j in range(i + 1, n):
            d[i, j] = d[j, i] = float(reduce(principal_angles(bases[i], bases[j])))
    return d

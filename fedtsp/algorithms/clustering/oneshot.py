"""One-shot clustering of clients from a distance matrix (used by FMCL and PACFL).

`ClusteringOptions`:

* ``method``: ``"agglomerative"`` (default; on the precomputed distances) or ``"kmeans"``
  (k-means on the classical-MDS coordinates of the distance matrix: the Euclidean embedding
  that best preserves the distances, since k-means needs points, not distances).
* ``linkage``: ``"average"`` (default), ``"complete"`` or ``"single"`` (agglomerative only).
* ``num_clusters``: an integer fixes k; ``None`` (default) chooses it by ``selection``:
  ``"silhouette"`` (default) tries k = 2 .. ``max_clusters`` and keeps the k with the best
  silhouette score on the distances; a best score below ``min_silhouette`` means "no cluster
  structure" and gives one cluster. ``"threshold"`` (agglomerative only) cuts the dendrogram
  at ``distance_threshold`` (linkage distance), so k follows from the data's scale.

Cluster labels are renumbered 0..k-1 in order of first appearance (client 0 is in cluster 0),
so equal partitions get equal label vectors.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from sklearn.cluster import AgglomerativeClustering, KMeans
from sklearn.metrics import silhouette_score

__all__ = ["ClusteringOptions", "cluster_clients", "canonical_labels", "mds_coordinates"]

METHODS = ("agglomerative", "kmeans")
LINKAGES = ("average", "complete", "single")
SELECTIONS = ("silhouette", "threshold")


@dataclass(frozen=True)
class ClusteringOptions:
    method: str = "agglomerative"
    linkage: str = "average"
    num_clusters: int | None = None
    selection: str = "silhouette"
    max_clusters: int = 10
    min_silhouette: float = 0.1
    distance_threshold: float = 0.5

    def validate(self) -> ClusteringOptions:
        if self.method not in METHODS:
            raise ValueError(
                f"clustering method={self.method!r} is invalid; choose one of {METHODS}"
            )
        if self.linkage not in LINKAGES:
            raise ValueError(f"linkage={self.linkage!r} is invalid; choose one of {LINKAGES}")
        if self.selection not in SELECTIONS:
            raise ValueError(f"selection={self.selection!r} is invalid; choose one of {SELECTIONS}")
        if (
            self.selection == "threshold"
            and self.method != "agglomerative"
            and self.num_clusters is None
        ):
            raise ValueError(
                "selection='threshold' needs method='agglomerative' (or a fixed num_clusters)"
            )
        if self.num_clusters is not None and (
            isinstance(self.num_clusters, bool)
            or not isinstance(self.num_clusters, int)
            or self.num_clusters < 1
        ):
            raise ValueError(
                f"num_clusters must be None (automatic) or an integer >= 1, got {self.num_clusters!r}"
            )
        if (
            isinstance(self.max_clusters, bool)
            or not isinstance(self.max_clusters, int)
            or self.max_clusters < 2
        ):
            raise ValueError(f"max_clusters must be an integer >= 2, got {self.max_clusters!r}")
        if not -1.0 <= self.min_silhouette <= 1.0:
            raise ValueError(f"min_silhouette must be in [-1, 1], got {self.min_silhouette!r}")
        if not self.distance_threshold > 0:
            raise ValueError(f"distance_threshold must be > 0, got {self.distance_threshold!r}")
        return self

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def canonical_labels(labels: np.ndarray) -> np.ndarray:
    """Renumber cluster labels 0..k-1 in order of first appearance."""
    mapping: dict[int, int] = {}
    return np.array([mapping.setdefault(int(v), len(mapping)) for v in labels], dtype=np.int64)


def mds_coordinates(distances: np.ndarray) -> np.ndarray:
    """Classical (Torgerson) MDS: points whose Euclidean distances approximate ``distances``."""
    d2 = np.asarray(distances, dtype=np.float64) ** 2
    n = d2.shape[0]
    j = np.eye(n) - 1.0 / n
    b = -0.5 * j @ d2 @ j
    vals, vecs = np.linalg.eigh(b)
    keep = vals > 1e-9 * max(vals.max(), 1e-12)
    if not keep.any():  # all points coincide
        return np.zeros((n, 1))
    return vecs[:, keep] * np.sqrt(vals[keep])


def _check_distances(distances: np.ndarray) -> np.ndarray:
    d = np.asarray(distances, dtype=np.float64)
    if d.ndim != 2 or d.shape[0] != d.shape[1] or d.shape[0] < 1:
        raise ValueError(f"distances must be a square (N, N) matrix, got shape {d.shape}")
    if not np.isfinite(d).all() or (d < -1e-9).any() or not np.allclose(d, d.T, atol=1e-6):
        raise ValueError("distances must be finite, non-negative and symmetric")
    d = np.clip((d + d.T) / 2, 0.0, None)
    np.fill_diagonal(d, 0.0)
    return d


def _fit(d: np.ndarray, k: int, opts: ClusteringOptions, seed: int) -> np.ndarray:
    if k == 1:
        return np.zeros(d.shape[0], dtype=np.int64)
    if opts.method == "agglomerative":
        model = AgglomerativeClustering(n_clusters=k, metric="precomputed", linkage=opts.linkage)
        return model.fit_predict(d)
    return KMeans(n_clusters=k, n_init=10, random_state=seed).fit_predict(mds_coordinates(d))


def cluster_clients(
    distances: np.ndarray, options: ClusteringOptions | None = None, seed: int = 0
) -> tuple[np.ndarray, dict[str, Any]]:
    """Cluster labels of every client and a dict of diagnostics (k, silhouette per k)."""
    opts = (options or ClusteringOptions()).validate()
    d = _check_distances(distances)
    n = d.shape[0]
    info: dict[str, Any] = {"silhouettes": {}}
    if opts.num_clusters is not None:
        if opts.num_clusters > n:
            raise ValueError(f"num_clusters={opts.num_clusters} is more than the {n} clients")
        labels = _fit(d, opts.num_clusters, opts, seed)
    elif opts.selection == "threshold":
        model = AgglomerativeClustering(
            n_clusters=None,
            metric="precomputed",
            linkage=opts.linkage,
            distance_threshold=opts.distance_threshold,
        )
        labels = model.fit_predict(d) if n > 1 else np.zeros(1, dtype=np.int64)
    else:
        best_k, best_s, best_labels = 1, -np.inf, np.zeros(n, dtype=np.int64)
        for k in range(2, min(opts.max_clusters, n - 1) + 1):
            cand = _fit(d, k, opts, seed)
            if len(np.unique(cand)) < 2:
                continue
            s = float(silhouette_score(d, cand, metric="precomputed"))
            info["silhouettes"][k] = s
            if s > best_s + 1e-12:
                best_k, best_s, best_labels = k, s, cand
        if best_s < opts.min_silhouette:
            best_labels = np.zeros(n, dtype=np.int64)
        labels = best_labels
        info["best_silhouette"] = None if best_s == -np.inf else best_s
        info["best_k_by_silhouette"] = best_k
    labels = canonical_labels(labels)
    info["num_clusters"] = int(labels.max()) + 1
    return labels, info

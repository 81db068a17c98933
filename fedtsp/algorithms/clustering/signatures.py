"""FMCL client signatures: per-class mean embeddings from a frozen encoder, and their distances.

A client embeds its training images once with a frozen foundation model and uploads, for
every class it holds, the mean embedding and the sample count (its *signature*; the only
message FMCL adds, sent once before training). The server compares two clients over the
classes both hold:

    d(i, j) = sum_c w_c (1 - cos(mu_ic, mu_jc)) / sum_c w_c,   c in classes(i) & classes(j)

Options (`SignatureOptions`), each an explicit choice FMCL's description leaves open:

* ``center`` (default True): before the cosine, subtract the count-weighted mean of all
  uploaded class means. Post-ReLU features are non-negative, so raw cosines crowd near 1 and
  differences between clients shrink; the server can compute this mean from the signatures
  alone, so centring costs no communication.
* ``class_weighting``: ``"uniform"`` (default; every shared class counts once) or ``"count"``
  (w_c = min(n_ic, n_jc), trusting well-populated classes more).
* ``min_class_count`` (default 1): classes with fewer samples on a client are left out of its
  signature (a mean of very few images is noisy).
* ``no_shared``: the rule for two clients without a shared class. ``"fixed"`` (default) sets
  their distance to ``no_shared_distance`` (default 1.0: "orthogonal", no evidence that they
  are alike); ``"client-mean"`` falls back to the cosine distance of the clients' overall mean
  embeddings.
* ``distance``: ``"shared-classes"`` (FMCL, above) or ``"client-mean"`` (class-agnostic: the
  cosine distance of overall mean embeddings; an ablation of the class awareness).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from fedtsp.core.atomic import atomic_save
from fedtsp.models.image_encoders import FrozenImageEncoder

__all__ = [
    "ClientSignature",
    "EmbeddingCache",
    "SignatureOptions",
    "client_signature",
    "embed_clients",
    "signature_distances",
]

NO_SHARED = ("fixed", "client-mean")
CLASS_WEIGHTINGS = ("uniform", "count")
DISTANCES = ("shared-classes", "client-mean")


@dataclass(frozen=True)
class SignatureOptions:
    center: bool = True
    class_weighting: str = "uniform"
    min_class_count: int = 1
    no_shared: str = "fixed"
    no_shared_distance: float = 1.0
    distance: str = "shared-classes"

    def validate(self) -> SignatureOptions:
        if self.class_weighting not in CLASS_WEIGHTINGS:
            raise ValueError(
                f"class_weighting={self.class_weighting!r} is invalid; choose one of {CLASS_WEIGHTINGS}"
            )
        if self.no_shared not in NO_SHARED:
            raise ValueError(f"no_shared={self.no_shared!r} is invalid; choose one of {NO_SHARED}")
        if self.distance not in DISTANCES:
            raise ValueError(f"distance={self.distance!r} is invalid; choose one of {DISTANCES}")
        if isinstance(self.min_class_count, bool) or not isinstance(self.min_class_count, int):
            raise ValueError(
                f"min_class_count must be an integer >= 1, got {self.min_class_count!r}"
            )
        if self.min_class_count < 1:
            raise ValueError(
                f"min_class_count must be an integer >= 1, got {self.min_class_count!r}"
            )
        if not 0.0 <= self.no_shared_distance <= 2.0:
            raise ValueError(
                f"no_shared_distance={self.no_shared_distance!r} is invalid; a cosine distance is in [0, 2]"
            )
        return self


@dataclass
class ClientSignature:
    """One client's upload: per-class mean embeddings (C, d) and counts (C,) (0 = not held)."""

    means: np.ndarray
    counts: np.ndarray

    @property
    def held(self) -> np.ndarray:
        return self.counts > 0

    @property
    def nbytes(self) -> int:
        """Upload size: float32 means of the held classes + one int32 count per class."""
        return int(self.held.sum()) * self.means.shape[1] * 4 + self.counts.shape[0] * 4


def client_signature(
    embeddings: np.ndarray | torch.Tensor, labels: np.ndarray, num_classes: int, min_count: int = 1
) -> ClientSignature:
    """Per-class mean of a client's embeddings; classes with < ``min_count`` samples dropped."""
    z = np.asarray(embeddings, dtype=np.float64)
    y = np.asarray(labels, dtype=np.int64)
    counts = np.bincount(y, minlength=num_classes)
    sums = np.zeros((num_classes, z.shape[1]))
    np.add.at(sums, y, z)
    counts = np.where(counts >= min_count, counts, 0)
    means = sums / np.maximum(counts, 1)[:, None]
    means[counts == 0] = 0.0
    return ClientSignature(means.astype(np.float32), counts.astype(np.int64))


def _unit(x: np.ndarray) -> np.ndarray:
    return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)


def signature_distances(
    signatures: list[ClientSignature], options: SignatureOptions | None = None
) -> np.ndarray:
    """Symmetric (N, N) matrix of client distances in [0, 2] with a zero diagonal."""
    opts = (options or SignatureOptions()).validate()
    means = np.stack([s.means for s in signatures]).astype(np.float64)  # (N, C, d)
    counts = np.stack([s.counts for s in signatures]).astype(np.float64)  # (N, C)
    if opts.center:
        # Count-weighted mean of all class means = the mean of all uploaded embeddings.
        center = (counts[..., None] * means).sum((0, 1)) / max(counts.sum(), 1.0)
        means = np.where(counts[..., None] > 0, means - center, 0.0)
    client_mean = _unit((counts[..., None] * means).sum(1) / np.maximum(counts.sum(1), 1)[:, None])
    mean_dist = 1.0 - client_mean @ client_mean.T
    if opts.distance == "client-mean":
        dist = mean_dist
    else:
        unit = _unit(means)
        held = counts > 0
        # cos[i, j, c] for every pair and class; (N, N, C) is small for tens of clients.
        cos = np.einsum("icd,jcd->ijc", unit, unit)
        if opts.class_weighting == "uniform":
            w = (held[:, None, :] & held[None, :, :]).astype(np.float64)
        else:
            w = np.minimum(counts[:, None, :], counts[None, :, :])
        wsum = w.sum(-1)
        dist = (w * (1.0 - cos)).sum(-1) / np.maximum(wsum, 1e-12)
        none = wsum == 0
        fallback = (
            np.full_like(dist, opts.no_shared_distance) if opts.no_shared == "fixed" else mean_dist
        )
        dist = np.where(none, fallback, dist)
    dist = np.clip((dist + dist.T) / 2, 0.0, 2.0)
    np.fill_diagonal(dist, 0.0)
    return dist


class EmbeddingCache:
    """On-disk cache of embeddings, one ``.npy`` per image set, keyed by its content.

    The key is sha256(encoder fingerprint (name, weights, preprocessing) + the raw bytes and
    shape of the uint8 images), so a cached entry is reused exactly when the same encoder would
    see the same pixels, whatever run, method or seed asks for it.
    """

    def __init__(self, root: str | Path | None) -> None:
        self.root = None if root is None else Path(root)

    @staticmethod
    def key(encoder: FrozenImageEncoder, images: np.ndarray) -> str:
        h = hashlib.sha256(encoder.fingerprint().encode())
        h.update(str(images.shape).encode())
        h.update(np.ascontiguousarray(images).data)
        return h.hexdigest()[:32]

    def get_or_compute(
        self, encoder: FrozenImageEncoder, images: np.ndarray, batch_size: int = 128
    ) -> np.ndarray:
        path = None
        if self.root is not None:
            path = self.root / f"{encoder.name}-{self.key(encoder, images)}.npy"
            if path.is_file():
                try:
                    return np.load(path, allow_pickle=False)
                except (OSError, ValueError):
                    pass  # a damaged entry is recomputed
        emb = encoder.encode(images, batch_size=batch_size).numpy().astype(np.float32)
        if path is not None:
            atomic_save(path, lambda f: np.save(f, emb, allow_pickle=False))
        return emb


def embed_clients(
    encoder: FrozenImageEncoder,
    client_images: list[np.ndarray],
    cache: EmbeddingCache | None = None,
    batch_size: int = 128,
    progress: bool = True,
) -> list[np.ndarray]:
    """Embeddings of every client's images (computed once per image set, then cached)."""
    cache = cache or EmbeddingCache(None)
    out = []
    for images in tqdm(
        client_images, disable=not progress, desc=f"embed ({encoder.name})", unit="client"
    ):
        out.append(cache.get_or_compute(encoder, images, batch_size))
    return out

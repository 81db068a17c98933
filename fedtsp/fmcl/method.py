"""FMCL: one-shot, class-aware client clustering from a frozen foundation model.

Before training, every client embeds its training images with a frozen image encoder
(`fedtsp.models.image_encoders`) and uploads its signature: per-class mean embeddings and
counts (`fedtsp.fmcl.signatures`). The server computes client-to-client distances over shared
classes, clusters the clients once (`fedtsp.fmcl.clustering`) and then runs FedAvg inside each
cluster (`fedtsp.fmcl.training`). Nothing else is communicated during training; the one-shot
upload's size is recorded. FMCL has no public code: every choice its description leaves open
is an option of `FMCLOptions`, with the defaults documented in the modules above.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from fedtsp.fmcl.clustering import ClusteringOptions, cluster_clients
from fedtsp.fmcl.signatures import (
    EmbeddingCache,
    SignatureOptions,
    client_signature,
    embed_clients,
    signature_distances,
)
from fedtsp.models.image_encoders import (
    FrozenImageEncoder,
    create_image_encoder,
    image_encoder_names,
)

__all__ = ["FMCLOptions", "fmcl_cluster", "fmcl_cluster_embeddings"]


@dataclass(frozen=True)
class FMCLOptions:
    encoder: str = "efficientnet-lite0"
    # Resolution images are resized to before the encoder (None: the encoder's own, 224).
    # CIFAR's 32x32 images carry no more detail at 224; 96 is ~10x faster on a CPU.
    input_size: int | None = 96
    signature: SignatureOptions = field(default_factory=SignatureOptions)
    clustering: ClusteringOptions = field(default_factory=ClusteringOptions)
    embed_batch_size: int = 128

    def validate(self) -> FMCLOptions:
        if self.encoder not in image_encoder_names():
            raise ValueError(
                f"FMCL encoder={self.encoder!r} is invalid; choose one of {', '.join(image_encoder_names())}"
            )
        self.signature.validate()
        self.clustering.validate()
        return self

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> FMCLOptions:
        values = dict(values)
        sig = SignatureOptions(**values.pop("signature", {}))
        clu = ClusteringOptions(**values.pop("clustering", {}))
        try:
            return cls(signature=sig, clustering=clu, **values).validate()
        except TypeError as exc:
            raise ValueError(f"unknown FMCL option in {sorted(values)}: {exc}") from None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def fmcl_cluster_embeddings(
    embeddings: Sequence[np.ndarray],
    labels: Sequence[np.ndarray],
    num_classes: int,
    options: FMCLOptions | None = None,
    seed: int = 0,
) -> tuple[np.ndarray, dict[str, Any]]:
    """Signatures -> distances -> clusters, from already computed per-client embeddings."""
    opts = (options or FMCLOptions()).validate()
    sigs = [
        client_signature(z, y, num_classes, opts.signature.min_class_count)
        for z, y in zip(embeddings, labels, strict=True)
    ]
    dist = signature_distances(sigs, opts.signature)
    assignment, info = cluster_clients(dist, opts.clustering, seed)
    info["distances"] = dist
    info["upload_bytes"] = [s.nbytes for s in sigs]
    return assignment, info


def fmcl_cluster(
    client_images: Sequence[np.ndarray],
    client_labels: Sequence[np.ndarray],
    num_classes: int,
    options: FMCLOptions | None = None,
    *,
    encoder: FrozenImageEncoder | None = None,
    cache_dir: str | Path | None = None,
    device: str = "cpu",
    seed: int = 0,
    progress: bool = True,
) -> tuple[np.ndarray, dict[str, Any]]:
    """FMCL's one-shot clustering of clients from their uint8 training images and labels.

    Returns the cluster of every client and diagnostics (distances, silhouettes, upload bytes,
    embedding seconds). Embeddings are cached under ``cache_dir`` when given.
    """
    opts = (options or FMCLOptions()).validate()
    if encoder is None:
        encoder = create_image_encoder(opts.encoder, input_size=opts.input_size, device=device)
    start = time.perf_counter()
    emb = embed_clients(
        encoder, list(client_images), EmbeddingCache(cache_dir), opts.embed_batch_size, progress
    )
    embed_seconds = time.perf_counter() - start
    assignment, info = fmcl_cluster_embeddings(emb, client_labels, num_classes, opts, seed)
    info["embed_seconds"] = embed_seconds
    info["encoder_fingerprint"] = encoder.fingerprint()
    return assignment, info

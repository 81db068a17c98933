"""FMCL: one-shot, class-aware client clustering from a frozen foundation model.

Each client embeds its training images once with a frozen image encoder
(`fedtsp.models.image_encoders`) and sends, in set-up, its signature: the mean
embedding and the sample count of every class it holds (`fedtsp.algorithms.clustering.signatures`).
The server computes client-to-client distances over shared classes, clusters the clients
once (`fedtsp.algorithms.clustering.oneshot`) and runs FedAvg inside each cluster from then on
(`fedtsp.algorithms.clustering.halves`). Nothing else is communicated; the signature's bytes count
in the set-up's upload. FMCL has no public code: every choice its description leaves open is
an option below, defaults documented in the modules named.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import torch

from fedtsp.algorithms.base import Algorithm, Message, register
from fedtsp.algorithms.clients import Client
from fedtsp.algorithms.clustering.halves import (
    ClusteredClient,
    ClusteredServer,
    ClusteringFields,
    jsonable,
)
from fedtsp.algorithms.clustering.oneshot import cluster_clients
from fedtsp.algorithms.clustering.signatures import (
    ClientSignature,
    EmbeddingCache,
    SignatureOptions,
    client_signature,
    signature_distances,
)
from fedtsp.core.environment import cache_root
from fedtsp.core.options import option
from fedtsp.data import pixels
from fedtsp.models.image_encoders import (
    FrozenImageEncoder,
    create_image_encoder,
    image_encoder_names,
)


@dataclass
class FMCLOptions(ClusteringFields):
    encoder: str = option(
        "efficientnet-lite0", "the frozen image encoder", choices=image_encoder_names
    )
    # CIFAR's 32x32 images carry no more detail at 224; 96 is ~10x faster on a CPU.
    input_size: int | None = option(96, "resolution before the encoder (none: its own, 224)")
    embed_batch_size: int = option(128, "images per encoder batch")
    center: bool = option(True, "subtract the mean of all class means before the cosine")
    class_weighting: str = option("uniform", "shared classes count: uniform or count")
    min_class_count: int = option(1, "classes with fewer samples stay out of a signature")
    no_shared: str = option("fixed", "clients without a shared class: fixed or client-mean")
    no_shared_distance: float = option(1.0, "no_shared=fixed: their distance")
    distance: str = option("shared-classes", "shared-classes (FMCL) or client-mean (ablation)")

    def signature(self) -> SignatureOptions:
        return SignatureOptions(
            center=self.center,
            class_weighting=self.class_weighting,
            min_class_count=self.min_class_count,
            no_shared=self.no_shared,
            no_shared_distance=self.no_shared_distance,
            distance=self.distance,
        )

    def validate(self) -> None:
        self.signature().validate()
        super().validate()


@functools.lru_cache(maxsize=2)
def frozen_encoder(name: str, input_size: int | None, device: str) -> FrozenImageEncoder:
    """One encoder per process: every client half in it embeds with the same weights."""
    return create_image_encoder(name, input_size=input_size, device=device)


class FMCLClient(ClusteredClient):
    """Sends its signature in set-up."""

    def extra_upload(self, client: Client) -> dict[str, torch.Tensor]:
        o = self.opts
        encoder = frozen_encoder(o.encoder, o.input_size, str(client.device))
        images = pixels(client.train_x).cpu().numpy()
        cache = EmbeddingCache(cache_root() / "fmcl-embeddings")
        embeddings = cache.get_or_compute(encoder, images, o.embed_batch_size)
        labels = client.train_y.cpu().numpy()
        sig = client_signature(embeddings, labels, client.num_classes, o.min_class_count)
        held = sig.counts > 0  # only the held classes' means travel
        return {
            "signature.means": torch.from_numpy(sig.means[held]),
            "signature.counts": torch.from_numpy(sig.counts.astype(np.int32)),
        }


class FMCLServer(ClusteredServer):
    """Clusters the clients once, from their signatures' distances."""

    def cluster_from(self, uploads: dict[int, Message]) -> np.ndarray:
        signatures = []
        for i in sorted(uploads):
            counts = uploads[i]["signature.counts"].cpu().numpy().astype(np.int64)
            held = uploads[i]["signature.means"].cpu().numpy()
            means = np.zeros((counts.shape[0], held.shape[1]), dtype=np.float32)
            means[counts > 0] = held
            signatures.append(ClientSignature(means, counts))
        distances = signature_distances(signatures, self.opts.signature())
        labels, info = cluster_clients(distances, self.opts.clustering(), self.ctx.seed)
        self.diagnostics = jsonable(info | {"distances": distances})
        return labels


# Revision 1: signatures sent in set-up, cluster k starts from `cluster_start(k)`.
FMCL = register(
    Algorithm("fmcl", FMCLClient, FMCLServer, FMCLOptions, settings=("pfl",), revision=1)
)

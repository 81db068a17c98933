"""PACFL (Vahidian et al., AAAI 2023): one-shot clustering by principal angles between the
clients' data subspaces, then FedAvg inside each cluster.

Each client sends, with its first upload, an orthonormal basis of the span of the ``rank``
leading left singular vectors of its data (per class, as the authors' code, or for all its
data; `fedtsp.algorithms.clustering.subspaces`). The server measures the principal angles between
every two clients' subspaces, reduces them to a distance (``angle_statistic``, radians) and
clusters the distance matrix with the same one-shot clustering as FMCL.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from fedtsp.algorithms.base import Message, register
from fedtsp.algorithms.clients import Client
from fedtsp.algorithms.clustering.oneshot import cluster_clients
from fedtsp.algorithms.clustering.subspaces import (
    ANGLE_STATISTICS,
    data_subspace,
    subspace_distances,
)
from fedtsp.algorithms.clusters import ClusteredFedAvg, ClusteringFields, jsonable
from fedtsp.algorithms.options import option
from fedtsp.data import pixels


@dataclass
class PACFLOptions(ClusteringFields):
    rank: int = option(3, "leading singular vectors per class (or per client)", ">= 1")
    per_class: bool = option(True, "one subspace per class (authors' code) or for all data")
    angle_statistic: str = option(
        "mean", "distance from the principal angles: mean, min or sum", choices=ANGLE_STATISTICS
    )


@register
class PACFL(ClusteredFedAvg):
    name = "pacfl"
    Options = PACFLOptions

    def extra_upload(self, client: Client) -> dict[str, torch.Tensor]:
        images = pixels(client.train_x).cpu().numpy()
        labels = client.train_y.cpu().numpy()
        basis = data_subspace(images, labels, self.opts.rank, self.opts.per_class)
        return {"subspace": torch.from_numpy(basis.astype(np.float32))}

    def cluster_from(self, uploads: dict[int, Message]) -> np.ndarray:
        bases = [uploads[i]["subspace"].cpu().double().numpy() for i in sorted(uploads)]
        distances = subspace_distances(bases, self.opts.angle_statistic)
        labels, info = cluster_clients(distances, self.opts.clustering(), self.ctx.seed)
        self.diagnostics = jsonable(info | {"distances": distances})
        return labels

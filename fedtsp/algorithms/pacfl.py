"""PACFL (Vahidian et al., AAAI 2023): one-shot clustering by principal angles between the
clients' data subspaces, then FedAvg inside each cluster.

Each client sends, in set-up, an orthonormal basis of the span of the ``rank``
leading left singular vectors of its data (per class, as the authors' code, or for all its
data; `fedtsp.algorithms.clustering.subspaces`). The server measures the principal angles between
every two clients' subspaces, reduces them to a distance (``angle_statistic``, radians) and
clusters the distance matrix once, before training.

The number of clusters follows PACFL's own rule by default: agglomerative clustering with
average linkage of the smallest principal angle between two clients' subspaces, merged
while the closest pair is within the threshold beta (``distance_threshold``), 4.9 degrees
as in the authors' CIFAR-10 script (``--cluster_alpha 4.9 --linkage average --n_basis 3``).
Their code approximates the smallest principal angle by the smallest arccos of an entry of
U_i^T U_j (never below the exact angle computed here), and its average linkage averages
the two merged rows rather than all pairs. FMCL's silhouette choice of k stays an option
(``selection="silhouette"``, ``angle_statistic="mean"``: the defaults of runs hashed
before this rule, key revision 0).
"""

from __future__ import annotations

import math
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
from fedtsp.algorithms.clustering.subspaces import (
    ANGLE_STATISTICS,
    data_subspace,
    subspace_distances,
)
from fedtsp.core.options import option
from fedtsp.data import pixels


@dataclass
class PACFLOptions(ClusteringFields):
    rank: int = option(3, "leading singular vectors per class (or per client)", ">= 1")
    per_class: bool = option(True, "one subspace per class (authors' code) or for all data")
    angle_statistic: str = option(
        "min",
        "distance from the principal angles: min (paper), mean or sum",
        choices=ANGLE_STATISTICS,
    )
    # PACFL's own rule for the number of clusters (see the module docstring).
    selection: str = option("threshold", "threshold (PACFL's beta) or silhouette (FMCL's rule)")
    distance_threshold: float = option(
        math.radians(4.9), "beta: merge while the smallest principal angle is below (radians)"
    )


class PACFLClient(ClusteredClient):
    def extra_upload(self, client: Client) -> dict[str, torch.Tensor]:
        images = pixels(client.train_x).cpu().numpy()
        labels = client.train_y.cpu().numpy()
        basis = data_subspace(images, labels, self.opts.rank, self.opts.per_class)
        return {"subspace": torch.from_numpy(basis.astype(np.float32))}


class PACFLServer(ClusteredServer):
    def cluster_from(self, uploads: dict[int, Message]) -> np.ndarray:
        bases = [uploads[i]["subspace"].cpu().double().numpy() for i in sorted(uploads)]
        distances = subspace_distances(bases, self.opts.angle_statistic)
        labels, info = cluster_clients(distances, self.opts.clustering(), self.ctx.seed)
        self.diagnostics = jsonable(info | {"distances": distances})
        return labels


# Revision 1: the defaults became PACFL's own threshold rule (was FMCL's silhouette).
# Revision 2: subspaces sent in set-up, cluster k starts from `cluster_start(k)`.
PACFL = register(
    Algorithm("pacfl", PACFLClient, PACFLServer, PACFLOptions, settings=("pfl",), revision=2)
)

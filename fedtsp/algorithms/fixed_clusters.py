"""FedAvg in fixed clusters: per-cluster FedAvg (`fedtsp.algorithms.clustering.halves`) with
clusters known before training.

``clusters``: ``one`` (plain FedAvg, one cluster), ``each`` (Local: every client alone, no
communication) or ``truth`` (the population's planted groups: the oracle clustering aims
for; needs a population run).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedtsp.algorithms.base import Algorithm, register
from fedtsp.algorithms.clustering.halves import ClusteredClient, ClusteredServer
from fedtsp.core.options import option

FIXED_CLUSTERS = ("one", "each", "truth")


@dataclass
class FixedClustersOptions:
    clusters: str = option(
        "one", "one (FedAvg), each (Local) or truth (the planted groups)", choices=FIXED_CLUSTERS
    )


class FixedClustersHalf:
    """Both halves: with ``clusters="each"`` (Local) nothing is sent."""

    @property
    def communicates(self) -> bool:
        return self.opts.clusters != "each"


class FixedClustersClient(FixedClustersHalf, ClusteredClient):
    pass


class FixedClustersServer(FixedClustersHalf, ClusteredServer):
    def initial_assignment(self) -> np.ndarray:
        n, how = self.ctx.num_clients, self.opts.clusters
        if how == "truth":
            if self.ctx.groups is None:
                raise ValueError(
                    "clusters='truth' needs a population with planted groups (--population)"
                )
            return np.asarray(self.ctx.groups)
        return np.zeros(n, dtype=np.int64) if how == "one" else np.arange(n)


FixedClusters = register(
    Algorithm(
        "clusters",
        FixedClustersClient,
        FixedClustersServer,
        FixedClustersOptions,
        settings=("pfl",),
        # Revision 1 (the oracle only): group k starts from `cluster_start(k)`, not all
        # groups from client 0's weights; FedAvg and Local are as before.
        revision=1,
        revision_of=lambda options: int(options.get("clusters") == "truth"),
    )
)

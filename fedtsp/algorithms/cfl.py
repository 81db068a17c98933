"""CFL (Sattler et al., IEEE TNNLS 2020): clustered FL by recursive bi-partitioning.

Start with one cluster; every round clients train from their cluster's model and upload
their weights; the server, which knows what it sent, takes each client's update dW_i and
averages per cluster. A cluster is split in two when training has stalled for the cluster
as a whole while its clients still move: ``criterion="absolute"`` is the paper's rule
||mean dW|| < eps1 and max ||dW_i|| > eps2; ``"relative"`` (default, scale-free, our choice
because eps1 / eps2 depend on model, data and learning rate) splits when
||mean dW|| / mean ||dW_i|| < ``stall_ratio``. The split is the paper's bi-partition:
complete-linkage agglomerative clustering of the clients' updates by cosine similarity.
Splits need ``warmup_rounds`` rounds first, ``min_cluster_size`` clients on each side and
``cooldown_rounds`` between two splits of the same lineage.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from sklearn.cluster import AgglomerativeClustering

from fedtsp.algorithms.base import Algorithm, Message, register
from fedtsp.algorithms.clients import ClientFacts
from fedtsp.algorithms.clustering.halves import ClusteredClient, ClusteredServer
from fedtsp.algorithms.model_messages import MODEL_PREFIX
from fedtsp.core.options import option

CRITERIA = ("relative", "absolute")


@dataclass
class CFLOptions:
    criterion: str = option(
        "relative", "split rule: relative (stall ratio) or absolute (paper)", choices=CRITERIA
    )
    stall_ratio: float = option(
        0.5, "relative: split when ||mean dW|| / mean ||dW_i|| < this", "(0, 1]"
    )
    eps1: float = option(0.4, "absolute (paper): ||mean dW|| < eps1 ...", "> 0")
    eps2: float = option(1.6, "... and max ||dW_i|| > eps2", "> 0")
    warmup_rounds: int = option(5, "rounds before the first split", ">= 1")
    cooldown_rounds: int = option(3, "rounds between two splits of one lineage", ">= 1")
    min_cluster_size: int = option(2, "clients on each side of a split, at least", ">= 1")
    max_clusters: int = option(10, "no split beyond this many clusters", ">= 1")


def cfl_bipartition(updates: torch.Tensor) -> np.ndarray:
    """Split clients in two by complete-linkage clustering of their updates' cosine similarity."""
    u = F.normalize(updates.double(), dim=1)
    sim = (u @ u.T).numpy()
    model = AgglomerativeClustering(n_clusters=2, metric="precomputed", linkage="complete")
    return model.fit_predict(1.0 - sim)


def _flat(message: Message) -> torch.Tensor:
    keys = sorted(k for k in message if k.startswith(MODEL_PREFIX))
    return torch.cat([message[k].detach().float().flatten().cpu() for k in keys])


class CFLServer(ClusteredServer):
    server_state = (*ClusteredServer.server_state, "last_split", "splits", "ratios")

    def setup(self, facts: list[ClientFacts], uploads: dict[int, Message]) -> Message:
        self.last_split: dict[int, int] = {}  # rounds done at a cluster's last split
        self.splits: list[dict[str, Any]] = []
        self.ratios: dict[str, float] = {}
        return super().setup(facts, uploads)

    def initial_assignment(self) -> np.ndarray:
        return np.zeros(self.ctx.num_clients, dtype=np.int64)  # one cluster to start

    def aggregate(self, round_index: int, uploads: dict[int, Message]) -> None:
        o, done = self.opts, round_index + 1
        order = sorted(uploads)
        sent = {i: self.models.get(int(self.assignment[i]), self.start) for i in order}
        dw = torch.stack([_flat(uploads[i]) - _flat(sent[i]) for i in order])
        self.ratios = {}
        for k in sorted(set(self.assignment.tolist())):
            members = np.array([n for n, i in enumerate(order) if self.assignment[i] == k])
            norms = dw[members].norm(dim=1)
            mean_norm = float(dw[members].mean(0).norm())
            # Recorded every round so that a run that never splits shows how close it came.
            self.ratios[str(k)] = mean_norm / max(float(norms.mean()), 1e-12)
            if o.criterion == "relative":
                stalled = self.ratios[str(k)] < o.stall_ratio
            else:
                stalled = mean_norm < o.eps1 and float(norms.max()) > o.eps2
            can_split = (
                done >= o.warmup_rounds
                and done - self.last_split.get(k, -o.cooldown_rounds) >= o.cooldown_rounds
                and len(members) >= 2 * o.min_cluster_size
                and len(set(self.assignment.tolist())) < o.max_clusters
            )
            if stalled and can_split:
                halves = cfl_bipartition(dw[members])
                sizes = [int((halves == 0).sum()), int((halves == 1).sum())]
                if min(sizes) >= o.min_cluster_size:
                    new_id = max(self.assignment.tolist()) + 1
                    self.assignment[[order[n] for n in members[halves == 1]]] = new_id
                    self.models[new_id] = self.models.get(k, self.start)
                    self.last_split[k] = self.last_split[new_id] = done
                    self.splits.append({"round": done, "cluster": k, "sizes": sizes})
        super().aggregate(round_index, uploads)

    def round_metrics(self) -> dict[str, Any]:
        return super().round_metrics() | {"cfl_stall_ratio": dict(self.ratios)}

    def record_extras(self) -> dict[str, Any]:
        return super().record_extras() | {"splits": self.splits}


# A CFL client only trains and uploads its cluster's model.
CFL = register(Algorithm("cfl", ClusteredClient, CFLServer, CFLOptions, settings=("pfl",)))

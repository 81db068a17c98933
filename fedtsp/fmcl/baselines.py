"""Clustered-FL baselines: IFCA, CFL and PACFL (FedAvg and Local are `train_fixed_clusters`).

* **IFCA** (Ghosh et al., 2020): the server keeps K cluster models, each from its own random
  initialisation. Every round each client downloads all K, picks the one with the lowest loss
  on its training data (`ifca_assign`), trains it locally and uploads it; the server averages
  the uploads per cluster (a cluster nobody picked keeps its model). Evaluation uses the model
  each client would pick at that moment. ``IFCAOptions.num_clusters`` (K) must be given.
* **CFL** (Sattler et al., 2020): start with one cluster; every round clients train from their
  cluster model and upload their update dW_i; the server averages updates per cluster. A
  cluster is split in two when training has stalled for the cluster as a whole while its
  clients still move: ``criterion="absolute"`` is the paper's rule ||mean dW|| < eps1 and
  max ||dW_i|| > eps2; ``"relative"`` (default, scale-free, our choice because eps1/eps2
  depend on model, data and learning rate) splits when ||mean dW|| / mean ||dW_i|| <
  ``stall_ratio``. The split is the paper's bi-partition: complete-linkage agglomerative
  clustering of the clients' updates by cosine similarity. Splits need ``warmup_rounds``
  rounds first, ``min_cluster_size`` clients on each side, and ``cooldown_rounds`` between
  two splits of the same lineage.
* **PACFL** (Vahidian et al., 2023): each client sends once the ``rank`` leading left singular
  vectors of its data matrix (flattened normalised images as columns), per class
  (``per_class=True``, as the authors' code) or for all data; the union is orthonormalised
  into one subspace per client. The server measures principal angles between every two
  clients' subspaces (`principal_angles`: arccos of the singular values of U_i^T U_j) and
  clusters the distance matrix (``angle_statistic``: mean (default), min or sum of the angles,
  in radians) with the same one-shot clustering as FMCL.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from sklearn.cluster import AgglomerativeClustering
from tqdm.auto import tqdm

from fedtsp.clients import Client
from fedtsp.fmcl.clustering import ClusteringOptions, canonical_labels, cluster_clients
from fedtsp.fmcl.training import (
    State,
    TrainOptions,
    TrainResult,
    average,
    evaluate,
    local_update,
    model_nbytes,
)
from fedtsp.models.families import build_model
from fedtsp.seeding import derive_seed, seed_everything

__all__ = [
    "CFLOptions",
    "IFCAOptions",
    "PACFLOptions",
    "client_losses",
    "data_subspace",
    "ifca_assign",
    "pacfl_cluster",
    "principal_angles",
    "run_cfl",
    "run_ifca",
]


# --------------------------------------------------------------------------- IFCA


@dataclass(frozen=True)
class IFCAOptions:
    num_clusters: int = 2

    def validate(self) -> IFCAOptions:
        if (
            isinstance(self.num_clusters, bool)
            or not isinstance(self.num_clusters, int)
            or self.num_clusters < 1
        ):
            raise ValueError(
                f"IFCA num_clusters must be an integer >= 1, got {self.num_clusters!r}"
            )
        return self


def ifca_assign(losses: np.ndarray) -> np.ndarray:
    """Index of the lowest-loss model per client (rows: clients, columns: models; ties: lowest)."""
    losses = np.asarray(losses, dtype=np.float64)
    if losses.ndim != 2 or losses.shape[1] < 1:
        raise ValueError(f"losses must be (clients, models), got shape {losses.shape}")
    return np.argmin(np.where(np.isfinite(losses), losses, np.inf), axis=1).astype(np.int64)


@torch.inference_mode()
def client_losses(client: Client, states: Sequence[State], batch_size: int = 1000) -> np.ndarray:
    """Mean cross-entropy of each model on the client's training data."""
    client.model.eval()
    out = []
    for state in states:
        client.model.load_state_dict(state)
        total = 0.0
        for lo in range(0, client.num_train, batch_size):
            x, y = client.train_x[lo : lo + batch_size], client.train_y[lo : lo + batch_size]
            total += float(F.cross_entropy(client.model(x), y, reduction="sum"))
        out.append(total / max(client.num_train, 1))
    return np.array(out)


def _fresh_state(clients: Sequence[Client], options: TrainOptions, seed: int) -> State:
    m = clients[0].model
    torch.manual_seed(seed)
    model = build_model(
        m.arch,
        m.num_classes,
        feature_dim=m.feature_dim,
        image_size=int(clients[0].train_x.shape[-1]),
    )
    return {k: v.detach().to(clients[0].device) for k, v in model.state_dict().items()}


def run_ifca(
    clients: Sequence[Client],
    options: IFCAOptions,
    train: TrainOptions,
    seed: int,
    *,
    progress: bool = True,
) -> TrainResult:
    opts = options.validate()
    k = opts.num_clusters
    models = [_fresh_state(clients, train, derive_seed(seed, 7, j)) for j in range(k)]
    sizes = [c.num_train for c in clients]
    nbytes = (k + 1) * model_nbytes(models[0])  # K models down, one up

    def assign() -> np.ndarray:
        return ifca_assign(np.stack([client_losses(c, models) for c in clients]))

    assignment = assign()
    history = [
        evaluate(clients, lambda i: models[assignment[i]], 0)
        | {"num_clusters": len(set(assignment))}
    ]
    for t in tqdm(range(train.rounds), disable=not progress, desc="ifca", unit="round"):
        start = time.perf_counter()
        seed_everything(derive_seed(seed, t + 1))
        new, losses = [], []
        for c in clients:
            state, loss = local_update(
                c, models[assignment[c.index]], train, derive_seed(seed, t + 1, c.index)
            )
            new.append(state)
            losses.append(loss)
        for j in range(k):
            members = np.flatnonzero(assignment == j)
            if len(members):
                models[j] = average(
                    [new[i] for i in members], [sizes[i] for i in members], train.weighting
                )
        assignment = assign()
        row = evaluate(clients, lambda i, a=assignment: models[a[i]], t + 1)
        history.append(
            row
            | {
                "train_loss": float(np.mean(losses)),
                "num_clusters": len(set(assignment.tolist())),
                "assignment": assignment.tolist(),
                "bytes_per_client": float(nbytes),
                "wall": time.perf_counter() - start,
            }
        )
    return TrainResult(history, canonical_labels(assignment), float(nbytes * train.rounds), {})


# --------------------------------------------------------------------------- CFL


@dataclass(frozen=True)
class CFLOptions:
    criterion: str = "relative"
    stall_ratio: float = 0.5  # relative: split when ||mean dW|| / mean ||dW_i|| < this
    eps1: float = 0.4  # absolute (paper): ||mean dW|| < eps1 ...
    eps2: float = 1.6  # ... and max ||dW_i|| > eps2
    warmup_rounds: int = 5
    cooldown_rounds: int = 3
    min_cluster_size: int = 2
    max_clusters: int = 10

    def validate(self) -> CFLOptions:
        if self.criterion not in ("relative", "absolute"):
            raise ValueError(
                f"CFL criterion={self.criterion!r} is invalid; choose 'relative' or 'absolute'"
            )
        if not 0 < self.stall_ratio <= 1:
            raise ValueError(f"CFL stall_ratio must be in (0, 1], got {self.stall_ratio!r}")
        if not (self.eps1 > 0 and self.eps2 > 0):
            raise ValueError(f"CFL eps1 and eps2 must be > 0, got {self.eps1!r}, {self.eps2!r}")
        for name in ("warmup_rounds", "cooldown_rounds", "min_cluster_size", "max_clusters"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"CFL {name} must be an integer >= 1, got {value!r}")
        return self


def _flat(state: State, keys: Sequence[str]) -> torch.Tensor:
    return torch.cat([state[k].detach().float().flatten().cpu() for k in keys])


def cfl_bipartition(updates: torch.Tensor) -> np.ndarray:
    """Split clients in two by complete-linkage clustering of their updates' cosine similarity."""
    u = F.normalize(updates.double(), dim=1)
    sim = (u @ u.T).numpy()
    model = AgglomerativeClustering(n_clusters=2, metric="precomputed", linkage="complete")
    return model.fit_predict(1.0 - sim)


def run_cfl(
    clients: Sequence[Client],
    options: CFLOptions,
    train: TrainOptions,
    seed: int,
    *,
    progress: bool = True,
) -> TrainResult:
    opts = options.validate()
    init = {k: v.detach().clone() for k, v in clients[0].model.state_dict().items()}
    keys = [k for k, v in init.items() if v.is_floating_point()]
    models: dict[int, State] = {0: init}
    assignment = np.zeros(len(clients), dtype=np.int64)
    last_split: dict[int, int] = {}  # round of the last split, per cluster
    sizes = [c.num_train for c in clients]
    nbytes = 2 * model_nbytes(init)
    splits: list[dict[str, Any]] = []
    history = [evaluate(clients, lambda i: models[assignment[i]], 0) | {"num_clusters": 1}]
    for t in tqdm(range(train.rounds), disable=not progress, desc="cfl", unit="round"):
        start = time.perf_counter()
        seed_everything(derive_seed(seed, t + 1))
        new, losses, updates = [], [], []
        for c in clients:
            base = models[assignment[c.index]]
            state, loss = local_update(c, base, train, derive_seed(seed, t + 1, c.index))
            new.append(state)
            losses.append(loss)
            updates.append(_flat(state, keys) - _flat(base, keys))
        dw = torch.stack(updates)
        ratios: dict[str, float] = {}
        for k in sorted(models):
            members = np.flatnonzero(assignment == k)
            if not len(members):
                continue
            norms = dw[members].norm(dim=1)
            mean_norm = float(dw[members].mean(0).norm())
            # Recorded every round so that a run that never splits shows how close it came.
            ratios[str(k)] = mean_norm / max(float(norms.mean()), 1e-12)
            if opts.criterion == "relative":
                stalled = ratios[str(k)] < opts.stall_ratio
            else:
                stalled = mean_norm < opts.eps1 and float(norms.max()) > opts.eps2
            can_split = (
                t + 1 >= opts.warmup_rounds
                and t + 1 - last_split.get(k, -opts.cooldown_rounds) >= opts.cooldown_rounds
                and len(members) >= 2 * opts.min_cluster_size
                and len(models) < opts.max_clusters
            )
            if stalled and can_split:
                halves = cfl_bipartition(dw[members])
                if min((halves == 0).sum(), (halves == 1).sum()) >= opts.min_cluster_size:
                    new_id = max(models) + 1
                    assignment[members[halves == 1]] = new_id
                    models[new_id] = models[k]
                    last_split[k] = last_split[new_id] = t + 1
                    splits.append(
                        {
                            "round": t + 1,
                            "cluster": k,
                            "sizes": [int((halves == 0).sum()), int((halves == 1).sum())],
                        }
                    )
        for k in sorted(models):
            members = np.flatnonzero(assignment == k)
            if len(members):
                models[k] = average(
                    [new[i] for i in members], [sizes[i] for i in members], train.weighting
                )
        row = evaluate(clients, lambda i: models[assignment[i]], t + 1)
        history.append(
            row
            | {
                "train_loss": float(np.mean(losses)),
                "num_clusters": len(set(assignment.tolist())),
                "cfl_stall_ratio": ratios,
                "bytes_per_client": float(nbytes),
                "wall": time.perf_counter() - start,
            }
        )
    return TrainResult(
        history, canonical_labels(assignment), float(nbytes * train.rounds), {"splits": splits}
    )


# --------------------------------------------------------------------------- PACFL


@dataclass(frozen=True)
class PACFLOptions:
    rank: int = 3  # leading singular vectors per class (or per client)
    per_class: bool = True
    angle_statistic: str = "mean"
    clustering: ClusteringOptions = field(default_factory=ClusteringOptions)

    def validate(self) -> PACFLOptions:
        if isinstance(self.rank, bool) or not isinstance(self.rank, int) or self.rank < 1:
            raise ValueError(f"PACFL rank must be an integer >= 1, got {self.rank!r}")
        if self.angle_statistic not in ("mean", "min", "sum"):
            raise ValueError(
                f"PACFL angle_statistic={self.angle_statistic!r} is invalid; choose mean, min or sum"
            )
        self.clustering.validate()
        return self

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


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


def pacfl_distances(bases: Sequence[np.ndarray], statistic: str = "mean") -> np.ndarray:
    n = len(bases)
    reduce = {"mean": np.mean, "min": np.min, "sum": np.sum}[statistic]
    d = np.zeros((n, n))
    for i in range(n):
        for j in range(i + 1, n):
            d[i, j] = d[j, i] = float(reduce(principal_angles(bases[i], bases[j])))
    return d


def pacfl_cluster(
    client_images: Sequence[np.ndarray],
    client_labels: Sequence[np.ndarray],
    options: PACFLOptions,
    seed: int = 0,
) -> tuple[np.ndarray, dict[str, Any]]:
    """PACFL's one-shot clustering; info holds the distances and the upload size per client."""
    opts = options.validate()
    bases = [
        data_subspace(x, y, opts.rank, opts.per_class)
        for x, y in zip(client_images, client_labels, strict=True)
    ]
    d = pacfl_distances(bases, opts.angle_statistic)
    labels, info = cluster_clients(d, opts.clustering, seed)
    info["distances"] = d
    # Each client uploads its rank-p bases (float32) before orthonormalising: D x r numbers.
    info["upload_bytes"] = [int(b.shape[0] * b.shape[1] * 4) for b in bases]
    return labels, info

"""Clustered federated training: one model per cluster, FedAvg inside each cluster.

The primitives here are shared by every clustered-FL method of `fedtsp.fmcl`:

* `build_clients`: every client as a `fedtsp.clients.Client` holding its data as tensors and
  its own copy of the small homogeneous model (same initial weights for all clients).
* `local_update`: load a cluster model, train ``local_epochs`` with cross-entropy and plain
  SGD (the protocol's optimiser), return the new weights.
* `evaluate`: every client's test split with the model of its cluster; the history row holds
  the sample-weighted accuracy over all test samples (``acc``, the project's "mean local
  accuracy") and the unweighted mean of per-client accuracies (``mean_client_acc``).
* `train_fixed_clusters`: the loop for one-shot methods (FMCL, PACFL, FedAvg = one cluster,
  Local = one cluster per client, oracle): round t = local training from the cluster model ->
  upload -> sample-weighted FedAvg per cluster (`fedtsp.aggregation.fedavg`) -> broadcast.
  Evaluation happens before round 0 and after every round (i.e. before the next round's
  training, as in the protocol); all clients take part in every round.

Communication is counted in bytes of float32 parameters: per round each client downloads its
cluster model and uploads its trained weights (Local: nothing).
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor
from tqdm.auto import tqdm

from fedtsp.aggregation import fedavg, normalized_weights
from fedtsp.clients import Client
from fedtsp.data import device_images
from fedtsp.fmcl.populations import Population
from fedtsp.models.families import ARCHITECTURES, build_model
from fedtsp.seeding import derive_seed, seed_everything

__all__ = [
    "TrainOptions",
    "TrainResult",
    "build_clients",
    "evaluate",
    "local_update",
    "model_nbytes",
    "train_fixed_clusters",
]

State = dict[str, Tensor]


@dataclass(frozen=True)
class TrainOptions:
    arch: str = "fedavgcnn_s"
    rounds: int = 20
    local_epochs: int = 1
    batch_size: int = 32
    lr: float = 0.01
    weighting: str = "samples"  # FedAvg weights inside a cluster: "samples" or "uniform"
    feature_dim: int = 512
    device: str = "cpu"
    channels_last: bool | None = None  # image layout; None: the device's faster one

    def validate(self) -> TrainOptions:
        if self.arch not in ARCHITECTURES:
            raise ValueError(
                f"arch={self.arch!r} is invalid; choose one of {', '.join(sorted(ARCHITECTURES))}"
            )
        for name in ("rounds", "local_epochs", "batch_size", "feature_dim"):
            value = getattr(self, name)
            low = 0 if name == "rounds" else 1
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0, got {self.lr!r}")
        if self.channels_last is not None and not isinstance(self.channels_last, bool):
            raise ValueError(
                f"channels_last must be true, false or None, got {self.channels_last!r}"
            )
        if self.weighting not in ("samples", "uniform"):
            raise ValueError(
                f"weighting={self.weighting!r} is invalid; choose 'samples' or 'uniform'"
            )
        return self

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class TrainResult:
    history: list[dict[str, Any]]
    assignment: np.ndarray  # final cluster of every client
    bytes_per_client: float  # training-time bytes (up + down), mean over clients
    extra: dict[str, Any]


def build_clients(population: Population, options: TrainOptions, seed: int) -> list[Client]:
    """Clients with tensors on the device and identical freshly initialised models."""
    opts = options.validate()
    device = torch.device(opts.device)
    seed_everything(derive_seed(seed, 0))
    template = build_model(
        opts.arch,
        population.num_classes,
        feature_dim=opts.feature_dim,
        in_channels=3,
        image_size=population.image_size,
    ).to(device)
    clients = []
    for i in range(population.num_clients):
        model = copy.deepcopy(template)

        def tensors(x: np.ndarray, y: np.ndarray) -> tuple[Tensor, Tensor]:
            x_dev = device_images(x, device, opts.channels_last)
            return x_dev, torch.from_numpy(y).long().to(device)

        tx, ty = tensors(population.train_x[i], population.train_y[i])
        vx, vy = tensors(population.test_x[i], population.test_y[i])
        client = Client(i, model, tx, ty, vx, vy, population.num_classes)
        client.optimizer = torch.optim.SGD(model.parameters(), lr=opts.lr)
        clients.append(client)
    return clients


def initial_state(clients: Sequence[Client]) -> State:
    return {k: v.detach().clone() for k, v in clients[0].model.state_dict().items()}


def model_nbytes(state: State) -> int:
    return sum(v.numel() * 4 for v in state.values() if v.is_floating_point())


def _ce(client: Client, x: Tensor, y: Tensor) -> Tensor:
    return F.cross_entropy(client.model(x), y)


def local_update(
    client: Client, state: State | None, options: TrainOptions, seed: int
) -> tuple[State, float]:
    """Train ``client`` from ``state`` (None: from its current weights); new weights, loss."""
    if state is not None:
        client.model.load_state_dict(state)
    gen = torch.Generator().manual_seed(seed)
    loss = client.train(_ce, options.local_epochs, options.batch_size, gen)
    return {k: v.detach().clone() for k, v in client.model.state_dict().items()}, loss


def average(states: Sequence[State], sizes: Sequence[int], weighting: str) -> State:
    """Sample-weighted (or uniform) FedAvg of full state dicts; integer buffers from the first."""
    keys = [k for k, v in states[0].items() if v.is_floating_point()]
    out = fedavg(states, normalized_weights(list(sizes), weighting), keys)
    for k, v in states[0].items():
        if k not in out:
            out[k] = v.clone()
    return out


def _predict(client: Client, x: Tensor) -> Tensor:
    return client.model(x)


def evaluate(
    clients: Sequence[Client], state_of: Callable[[int], State | None], round_index: int
) -> dict[str, Any]:
    """Evaluate every client's test split with ``state_of(i)`` (None: its current weights)."""
    results = []
    for c in clients:
        state = state_of(c.index)
        if state is not None:
            c.model.load_state_dict(state)
        results.append(c.evaluate(_predict, c.test_x, c.test_y))
    total = sum(r.total for r in results)
    accs = [r.accuracy for r in results]
    return {
        "round": round_index,
        "acc": sum(r.correct for r in results) / total,
        "top5": sum(r.correct_top5 for r in results) / total,
        "test_loss": sum(r.loss_sum for r in results) / total,
        "mean_client_acc": float(np.mean(accs)),
        "client_acc": [round(a, 6) for a in accs],
    }


def train_fixed_clusters(
    clients: Sequence[Client],
    assignment: np.ndarray,
    options: TrainOptions,
    seed: int,
    *,
    local_only: bool = False,
    progress: bool = True,
    desc: str = "train",
) -> TrainResult:
    """FedAvg inside each fixed cluster (``local_only``: no averaging, no communication)."""
    assignment = np.asarray(assignment, dtype=np.int64)
    if assignment.shape != (len(clients),) or assignment.min() < 0:
        raise ValueError("assignment must give every client exactly one cluster id >= 0")
    init = initial_state(clients)
    clusters = sorted(set(assignment.tolist()))
    models: dict[int, State] = {k: init for k in clusters}
    sizes = [c.num_train for c in clients]
    nbytes = 0 if local_only else 2 * model_nbytes(init)

    def state_of(i: int) -> State | None:
        return None if local_only else models[int(assignment[i])]

    history = [evaluate(clients, state_of, 0) | {"num_clusters": len(clusters)}]
    for t in tqdm(range(options.rounds), disable=not progress, desc=desc, unit="round"):
        start = time.perf_counter()
        seed_everything(derive_seed(seed, t + 1))
        new_states, losses = [], []
        for c in clients:
            state, loss = local_update(
                c, state_of(c.index), options, derive_seed(seed, t + 1, c.index)
            )
            new_states.append(state)
            losses.append(loss)
        if not local_only:
            for k in clusters:
                members = np.flatnonzero(assignment == k)
                models[k] = average(
                    [new_states[i] for i in members], [sizes[i] for i in members], options.weighting
                )
        row = evaluate(clients, state_of, t + 1)
        row |= {
            "train_loss": float(np.mean(losses)),
            "num_clusters": len(clusters),
            "bytes_per_client": float(nbytes),
            "wall": time.perf_counter() - start,
        }
        history.append(row)
    return TrainResult(history, assignment.copy(), float(nbytes * options.rounds), {})

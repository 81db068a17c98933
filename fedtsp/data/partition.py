"""The authors' federated data protocol: merge, Dirichlet label partition, 75/25 client split.

Follows HtFLlib's ``separate_data`` (partition ``"dir"``) and ``split_data``:

1. the official train and test sets are merged (train first, then test);
2. optionally a stratified subsample of the merged set is taken (our addition, for
   reduced-scale profiles);
3. for each class k: its indices are shuffled, proportions are drawn from Dir(alpha) over the
   clients, clients already holding at least ``total / num_clients`` samples get no more, and
   the class is cut at the cumulative proportions; the whole draw is repeated until every client
   holds at least ``min_size`` samples (HtFLlib's loop is unbounded; here it stops after
   ``max_redraws`` draws with a `PartitionError`);
4. each client's indices are split 75 % train / 25 % test, shuffled and not stratified, exactly
   as ``sklearn.model_selection.train_test_split(shuffle=True, train_size=0.75)`` does.

`make_partition` draws steps 3 and 4 from one ``np.random.RandomState(seed)``, in the same
order of calls as the authors' script, which seeds numpy's global generator once and calls
``separate_data`` then ``split_data``. Nothing here reads or changes numpy's global state.
All indices returned point into the merged (train + test) arrays.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from fedtsp.core.errors import UserError

if TYPE_CHECKING:
    from fedtsp.data.images import ImageDataset

__all__ = [
    "Partition",
    "PartitionError",
    "dirichlet_partition",
    "make_partition",
    "merge_splits",
    "merged_labels",
    "min_client_size",
    "split_clients",
    "stratified_subsample",
]

Seed = int | np.random.RandomState


class PartitionError(UserError, ValueError):
    """The requested partition cannot be drawn (bad input, or the minimum size is not met)."""


def _rng(seed: Seed) -> np.random.RandomState:
    # Passing a RandomState continues its stream (how make_partition chains the steps).
    if isinstance(seed, np.random.RandomState):
        return seed
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or not 0 <= seed < 2**32:
        raise PartitionError(f"seed must be an integer in [0, 2**32), got {seed!r}")
    return np.random.RandomState(int(seed))


def _check_labels(labels: np.ndarray | Sequence[int]) -> np.ndarray:
    y = np.asarray(labels)
    if y.ndim != 1 or y.size == 0:
        raise PartitionError(f"labels must be a non-empty 1-D array, got shape {y.shape}")
    if not np.issubdtype(y.dtype, np.integer):
        raise PartitionError(f"labels must be integers, got dtype {y.dtype}")
    if y.min() < 0:
        raise PartitionError(f"labels must be >= 0, got {int(y.min())}")
    return y.astype(np.int64, copy=False)


def _check_int(name: str, value: Any, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        raise PartitionError(f"{name} must be an integer >= {low}, got {value!r}")
    return int(value)


def merged_labels(dataset: ImageDataset) -> np.ndarray:
    """Train labels followed by test labels, the order every partition index refers to."""
    return np.concatenate([dataset.train_labels, dataset.test_labels]).astype(np.int64)


def merge_splits(dataset: ImageDataset) -> tuple[np.ndarray, np.ndarray]:
    """Merged (train then test) uint8 images and int64 labels, as the authors' protocol uses."""
    images = np.concatenate([dataset.train_images, dataset.test_images])
    return images, merged_labels(dataset)


def stratified_subsample(
    labels: np.ndarray | Sequence[int], fraction: float, seed: Seed = 1
) -> np.ndarray:
    """Sorted indices of a class-proportional random subsample holding ``fraction`` of the data.

    Each class keeps ``fraction`` of its samples; the rounding remainders are given to the
    classes with the largest fractional parts (ties: lower class first) so that the total is
    ``round(fraction * len(labels))``.
    """
    y = _check_labels(labels)
    if not (isinstance(fraction, (int, float)) and 0.0 < fraction <= 1.0):
        raise PartitionError(f"fraction must be in (0, 1], got {fraction!r}")
    if fraction == 1.0:
        return np.arange(y.size, dtype=np.int64)
    rng = _rng(seed)
    classes, counts = np.unique(y, return_counts=True)
    exact = counts * float(fraction)
    keep = np.floor(exact).astype(np.int64)
    target = int(math.floor(fraction * y.size + 0.5))
    order = np.argsort(-(exact - keep), kind="stable")
    keep[order[: max(0, target - int(keep.sum()))]] += 1
    chosen = [
        rng.permutation(np.flatnonzero(y == k))[:n] for k, n in zip(classes, keep, strict=True)
    ]
    return np.sort(np.concatenate(chosen)).astype(np.int64)


def min_client_size(
    batch_size: int, total: int, num_clients: int, train_ratio: float = 0.75
) -> int:
    """The authors' minimum client size: ``int(min(batch_size / (1 - train_ratio), total / N / 2))``.

    400 for CIFAR (60,000 samples), 20 clients and batch 100.
    """
    batch_size = _check_int("batch_size", batch_size, 1)
    total = _check_int("total", total, 1)
    num_clients = _check_int("num_clients", num_clients, 1)
    if not 0.0 < train_ratio < 1.0:
        raise PartitionError(f"train_ratio must be in (0, 1), got {train_ratio!r}")
    return int(min(batch_size / (1 - train_ratio), total / num_clients / 2))


def _dirichlet_draws(
    y: np.ndarray,
    num_clients: int,
    alpha: float,
    min_size: int,
    rng: np.random.RandomState,
    max_redraws: int,
    num_classes: int,
) -> tuple[list[np.ndarray], int]:
    """The redraw loop; returns the client index lists and the number of draws used."""
    total = y.size
    cap = total / num_clients  # clients at or above this receive no more samples
    by_class = [np.flatnonzero(y == k) for k in range(num_classes)]
    best = -1
    for draw in range(1, max_redraws + 1):
        batches: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
        sizes = np.zeros(num_clients, dtype=np.int64)
        failed = False
        for k in range(num_classes):
            idx_k = by_class[k].copy()
            rng.shuffle(idx_k)
            p = rng.dirichlet(np.repeat(alpha, num_clients))
            p = p * (sizes < cap)
            if not p.sum() > 0:
                # Very small alpha can put all mass (to float precision) on full clients; the
                # authors' code then divides by zero. Count it as a failed draw instead.
                failed = True
                break
            p = p / p.sum()
            cuts = (np.cumsum(p) * len(idx_k)).astype(int)[:-1]
            for j, piece in enumerate(np.split(idx_k, cuts)):
                batches[j].append(piece)
                sizes[j] += piece.size
        if failed:
            continue
        smallest = int(sizes.min())
        best = max(best, smallest)
        if smallest >= min_size:
            clients = [
                np.concatenate(b).astype(np.int64) if b else np.zeros(0, np.int64) for b in batches
            ]
            return clients, draw
    best_text = f"{best}" if best >= 0 else "none (every draw degenerated)"
    raise PartitionError(
        f"Dirichlet partition failed: {max_redraws} draws of Dir(alpha={alpha}) over "
        f"{num_clients} clients ({total} samples, {num_classes} classes) never gave every client "
        f"at least min_size={min_size} samples (best smallest client: {best_text}); use fewer "
        f"clients, a larger alpha, more data (a larger fraction) or a smaller minimum size."
    )


def dirichlet_partition(
    labels: np.ndarray | Sequence[int],
    num_clients: int,
    alpha: float,
    min_size: int,
    seed: Seed = 1,
    max_redraws: int = 100,
    *,
    num_classes: int | None = None,
) -> list[np.ndarray]:
    """Split sample indices over clients with HtFLlib's Dirichlet label partition.

    Returns one int64 index array per client (class by class, shuffled within each class, as
    the authors' code builds them). ``num_classes`` defaults to ``max(labels) + 1``; pass it
    when some classes are absent so the random stream matches a run over all classes. Raises
    `PartitionError` for bad input or when ``max_redraws`` draws never meet ``min_size``.
    """
    y = _check_labels(labels)
    clients, _ = _partition_checked(
        y, num_clients, alpha, min_size, _rng(seed), max_redraws, num_classes
    )
    return clients


def _partition_checked(
    y: np.ndarray,
    num_clients: int,
    alpha: float,
    min_size: int,
    rng: np.random.RandomState,
    max_redraws: int,
    num_classes: int | None,
) -> tuple[list[np.ndarray], int]:
    num_clients = _check_int("num_clients", num_clients, 1)
    min_size = _check_int("min_size", min_size, 0)
    max_redraws = _check_int("max_redraws", max_redraws, 1)
    if not (isinstance(alpha, (int, float)) and math.isfinite(alpha) and alpha > 0):
        raise PartitionError(f"alpha must be a finite number > 0, got {alpha!r}")
    k = int(y.max()) + 1
    if num_classes is not None:
        if _check_int("num_classes", num_classes, 1) < k:
            raise PartitionError(f"num_classes={num_classes} but labels go up to {k - 1}")
        k = int(num_classes)
    if num_clients * min_size > y.size:
        raise PartitionError(
            f"cannot give {num_clients} clients at least {min_size} samples each from only "
            f"{y.size} samples; lower min_size or the number of clients"
        )
    return _dirichlet_draws(y, num_clients, float(alpha), min_size, rng, max_redraws, k)


def split_clients(
    client_indices: Sequence[np.ndarray], train_ratio: float = 0.75, seed: Seed = 1
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Split each client's indices into train and test, shuffled and not stratified.

    Same draws as ``train_test_split(idx, train_size=train_ratio, shuffle=True,
    random_state=rng)`` per client in order: ``n_train = floor(train_ratio * n)``, one
    permutation, test = its first ``n - n_train`` entries, train = the rest.
    """
    if not (isinstance(train_ratio, (int, float)) and 0.0 < train_ratio < 1.0):
        raise PartitionError(f"train_ratio must be in (0, 1), got {train_ratio!r}")
    rng = _rng(seed)
    train, test = [], []
    for i, idx in enumerate(client_indices):
        idx = np.asarray(idx, dtype=np.int64)
        n = idx.size
        n_train = int(math.floor(train_ratio * n))
        n_test = n - n_train
        if n_train == 0 or n_test == 0:
            raise PartitionError(
                f"client {i} has {n} samples, too few for a {train_ratio:g} train split"
            )
        perm = rng.permutation(n)
        test.append(idx[perm[:n_test]])
        train.append(idx[perm[n_test:]])
    return train, test


@dataclass
class Partition:
    """Per-client train/test indices into the merged (train + test) arrays, with provenance."""

    client_train: list[np.ndarray]
    client_test: list[np.ndarray]
    num_classes: int
    # Merged labels (train then test) that the indices refer to.
    labels: np.ndarray
    alpha: float | None = None
    seed: int | None = None
    fraction: float = 1.0
    min_size: int | None = None
    batch_size: int | None = None
    train_ratio: float = 0.75
    max_redraws: int | None = None
    # Number of Dirichlet draws it took to meet min_size.
    draws: int | None = None
    # Sorted merged indices kept by the stratified subsample (None when fraction == 1).
    subsample: np.ndarray | None = None

    @property
    def num_clients(self) -> int:
        return len(self.client_train)

    def client_indices(self, i: int) -> np.ndarray:
        """All of client ``i``'s samples (train then test)."""
        return np.concatenate([self.client_train[i], self.client_test[i]])

    def class_counts(self) -> np.ndarray:
        """int64 array (num_clients, num_classes, 2): [..., 0] train and [..., 1] test counts."""
        out = np.zeros((self.num_clients, self.num_classes, 2), dtype=np.int64)
        for i in range(self.num_clients):
            for s, idx in enumerate((self.client_train[i], self.client_test[i])):
                out[i, :, s] = np.bincount(self.labels[idx], minlength=self.num_classes)
        return out

    def label_histogram(self) -> list[list[list[int]]]:
        """HtFLlib's "Size of samples for labels in clients": per client [label, count] pairs."""
        counts = self.class_counts().sum(axis=2)
        return [[[int(k), int(c)] for k, c in enumerate(row) if c > 0] for row in counts]

    def stats(self) -> dict[str, Any]:
        """JSON-serialisable summary for a run record."""
        counts = self.class_counts()
        train_sizes = [int(x) for x in counts[:, :, 0].sum(axis=1)]
        test_sizes = [int(x) for x in counts[:, :, 1].sum(axis=1)]
        sizes = [a + b for a, b in zip(train_sizes, test_sizes, strict=True)]
        return {
            "num_clients": self.num_clients,
            "num_classes": self.num_classes,
            "alpha": self.alpha,
            "seed": self.seed,
            "fraction": self.fraction,
            "min_size": self.min_size,
            "batch_size": self.batch_size,
            "train_ratio": self.train_ratio,
            "draws": self.draws,
            "num_samples": int(sum(sizes)),
            "sizes": sizes,
            "train_sizes": train_sizes,
            "test_sizes": test_sizes,
            "smallest_client": int(min(sizes)),
            "largest_client": int(max(sizes)),
            "classes_per_client": [int((row > 0).sum()) for row in counts.sum(axis=2)],
            "train_class_counts": counts[:, :, 0].tolist(),
            "test_class_counts": counts[:, :, 1].tolist(),
        }


def make_partition(
    labels: np.ndarray | Sequence[int],
    num_classes: int,
    num_clients: int,
    alpha: float,
    *,
    batch_size: int = 100,
    train_ratio: float = 0.75,
    seed: int = 1,
    fraction: float = 1.0,
    min_size: int | None = None,
    max_redraws: int = 100,
) -> Partition:
    """Subsample (optional), Dirichlet-partition and 75/25-split merged labels, in one call.

    ``min_size=None`` applies the protocol rule to the FULL merged set and scales it by
    ``fraction``: ``floor(min_client_size(batch_size, len(labels), num_clients) * fraction)``
    (400 -> 100 for CIFAR, 20 clients, fraction 0.25). Scaling keeps the rule's meaning (a
    client holds a fixed share of the data); the unscaled rule on a 0.25 subsample (375) is
    not met by Dir(0.1) over 20 clients. At ``fraction=1`` this is exactly the authors' rule.
    """
    y = _check_labels(labels)
    if not (isinstance(fraction, (int, float)) and 0.0 < fraction <= 1.0):
        raise PartitionError(f"fraction must be in (0, 1], got {fraction!r}")
    seed = _check_int("seed", seed, 0)
    if min_size is None:
        rule = min_client_size(batch_size, y.size, num_clients, train_ratio)
        min_size = int(math.floor(rule * fraction + 1e-9))
        # Every client needs at least one train and one test sample after the split.
        min_size = max(min_size, math.ceil(1 / min(train_ratio, 1 - train_ratio)))
    available = int(round(y.size * fraction))
    if num_clients > available:
        raise PartitionError(
            f"num_clients={num_clients} is more than the {available} samples available; "
            "use fewer clients or more data"
        )
    sub = stratified_subsample(y, fraction, seed) if fraction < 1.0 else None
    local = y if sub is None else y[sub]
    # One generator for the partition and the splits, in the authors' order of calls.
    rng = np.random.RandomState(seed)
    clients, draws = _partition_checked(
        local, num_clients, alpha, min_size, rng, max_redraws, num_classes
    )
    if sub is not None:
        clients = [sub[c] for c in clients]
    train, test = split_clients(clients, train_ratio, rng)
    return Partition(
        client_train=train,
        client_test=test,
        num_classes=int(num_classes),
        labels=y,
        alpha=float(alpha),
        seed=seed,
        fraction=float(fraction),
        min_size=int(min_size),
        batch_size=int(batch_size),
        train_ratio=float(train_ratio),
        max_redraws=int(max_redraws),
        draws=draws,
        subsample=sub,
    )

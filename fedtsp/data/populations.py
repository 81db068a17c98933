"""Client populations with planted ground-truth groups: the benchmark's known answer.

A `Population` is every client's train/test images (uint8 NCHW at one common size, 3
channels), labels in one shared label space, and the group each client was drawn from.

Kinds (`PopulationSpec.kind`):

* ``"label-groups"``: one dataset; its classes are dealt into ``num_groups`` disjoint sets and
  every client of group g holds only classes of set g. ``grouping="semantic"`` deals the
  dataset's semantic groups round-robin (CIFAR-100: the 20 superclasses, so 4 groups get 5
  superclasses = 25 fine classes each; CIFAR-10: animals / vehicles), ``"contiguous"`` cuts
  the label range into equal blocks. With ``overlap`` > 0 the groups' class sets overlap in
  a ring: group g also holds the first ``overlap`` share of group g+1's set (mod G), and
  every shared class's samples are dealt evenly between the groups holding it, so no sample
  is in two clients. ``overlap=1``: every class in exactly two groups, neighbouring groups
  share half their classes, the others none (clustering is then not trivial: label sets
  alone do not separate the groups).
* ``"mixed-domain"``: several datasets (default CIFAR-10 and Fashion-MNIST); group = dataset.
  Images are brought to ``image_size`` (bilinear) and 3 channels (grey repeated). With
  ``label_space="shared"`` (default) label k of every domain is output k of one 10-way head
  (concept shift: a single model must serve both domains, the case clustering should fix);
  ``"disjoint"`` offsets each domain's labels so the label spaces do not overlap.

Clients are dealt to groups round-robin (client i -> group i mod G), so groups are equal in
size up to one client. Inside a group, the group's pool of samples (a stratified ``fraction``
of the merged train+test set of its classes) is split over its clients IID
(``within_group_alpha=None``, default) or by the authors' Dirichlet rule; each client's samples
are then split 75/25 into train/test, as in the federated protocol.
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from fedtsp.core.errors import UserError
from fedtsp.data import (
    ImageDataset,
    dataset_info,
    dirichlet_partition,
    load_dataset,
    merge_splits,
    semantic_groups,
    split_clients,
    stratified_subsample,
)

__all__ = ["KINDS", "POPULATIONS", "Population", "PopulationSpec", "build_population"]

KINDS = ("label-groups", "mixed-domain")
GROUPINGS = ("semantic", "contiguous")
LABEL_SPACES = ("shared", "disjoint")


class PopulationError(UserError, ValueError):
    """A population specification that cannot be built."""


@dataclass(frozen=True)
class PopulationSpec:
    """Everything that defines a population; its `key()` goes into run records."""

    kind: str = "label-groups"
    # label-groups: one dataset; mixed-domain: one per domain.
    datasets: tuple[str, ...] = ("cifar100",)
    num_clients: int = 20
    num_groups: int = 4  # label-groups only (mixed-domain: one group per dataset)
    fraction: float = 0.1  # of each dataset's merged train+test set
    grouping: str = "semantic"
    label_space: str = "shared"
    within_group_alpha: float | None = None  # None: IID inside a group
    overlap: float = 0.0  # label-groups: share of group g+1's classes group g also holds
    image_size: int = 32
    train_ratio: float = 0.75
    seed: int = 1  # the protocol's partition seed

    def validate(self) -> PopulationSpec:
        def bad(name: str, value: Any, allowed: str) -> None:
            raise PopulationError(f"population {name}={value!r} is invalid; {allowed}")

        if self.kind not in KINDS:
            bad("kind", self.kind, f"choose one of {KINDS}")
        if not self.datasets:
            bad("datasets", self.datasets, "give at least one dataset")
        for name in self.datasets:
            dataset_info(name)  # raises a clear ValueError for unknown names
        if self.kind == "label-groups" and len(self.datasets) != 1:
            bad("datasets", self.datasets, "label-groups uses exactly one dataset")
        if self.kind == "mixed-domain" and len(self.datasets) < 2:
            bad("datasets", self.datasets, "mixed-domain needs at least two datasets")
        if self.grouping not in GROUPINGS:
            bad("grouping", self.grouping, f"choose one of {GROUPINGS}")
        if self.label_space not in LABEL_SPACES:
            bad("label_space", self.label_space, f"choose one of {LABEL_SPACES}")
        groups = self.num_groups if self.kind == "label-groups" else len(self.datasets)
        if isinstance(self.num_groups, bool) or not isinstance(self.num_groups, int):
            bad("num_groups", self.num_groups, "it must be an integer >= 1")
        if groups < 1:
            bad("num_groups", self.num_groups, "it must be >= 1")
        if not isinstance(self.num_clients, int) or self.num_clients < groups:
            bad("num_clients", self.num_clients, f"it must be an integer >= {groups} (groups)")
        if not (isinstance(self.fraction, (int, float)) and 0 < self.fraction <= 1):
            bad("fraction", self.fraction, "it must be in (0, 1]")
        if self.within_group_alpha is not None and not self.within_group_alpha > 0:
            bad("within_group_alpha", self.within_group_alpha, "it must be > 0 or None (IID)")
        if not (isinstance(self.overlap, (int, float)) and 0 <= self.overlap <= 1):
            bad("overlap", self.overlap, "it must be in [0, 1]")
        if self.overlap and self.kind != "label-groups":
            bad("overlap", self.overlap, "only label-groups populations overlap")
        if not isinstance(self.image_size, int) or self.image_size < 16:
            bad("image_size", self.image_size, "it must be an integer >= 16")
        if not 0 < self.train_ratio < 1:
            bad("train_ratio", self.train_ratio, "it must be in (0, 1)")
        return self

    @property
    def groups(self) -> int:
        return self.num_groups if self.kind == "label-groups" else len(self.datasets)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"datasets": list(self.datasets)}


# Named populations (RunConfig.population); a run sets num_clients, fraction, train_ratio
# and the partition seed from its config.
POPULATIONS: dict[str, PopulationSpec] = {
    # CIFAR-100 clients from 4 disjoint sets of 5 superclasses (25 fine classes each).
    "label-groups": PopulationSpec(kind="label-groups", datasets=("cifar100",), num_groups=4),
    # The same 4 groups, each also holding the next group's 25 classes (50 classes a group,
    # every class in two groups): the label groups overlap, as real populations do.
    "overlapping-labels": PopulationSpec(
        kind="label-groups", datasets=("cifar100",), num_groups=4, overlap=1.0
    ),
    # CIFAR-10 clients and Fashion-MNIST clients (32x32 RGB), one shared 10-way label space.
    "mixed-domain": PopulationSpec(kind="mixed-domain", datasets=("cifar10", "fmnist")),
}


def named_population(
    name: str, num_clients: int, fraction: float, train_ratio: float, seed: int
) -> PopulationSpec:
    """The named population at a run's size, fraction, split and partition seed."""
    if name not in POPULATIONS:
        raise PopulationError(
            f"population={name!r} is invalid; choose one of {', '.join(POPULATIONS)}"
        )
    spec = POPULATIONS[name]
    return PopulationSpec(
        **spec.to_dict()
        | {
            "datasets": spec.datasets,
            "num_clients": num_clients,
            "fraction": fraction,
            "train_ratio": train_ratio,
            "seed": seed,
        }
    ).validate()


@dataclass
class Population:
    """Per-client data of a population and the ground truth it was built from."""

    spec: PopulationSpec
    num_classes: int
    class_names: list[str]
    train_x: list[np.ndarray]  # uint8 (n, 3, S, S) per client
    train_y: list[np.ndarray]
    test_x: list[np.ndarray]
    test_y: list[np.ndarray]
    groups: np.ndarray  # ground-truth group of every client
    group_names: list[str]
    dataset_checksums: dict[str, str] = field(default_factory=dict)

    @property
    def num_clients(self) -> int:
        return len(self.train_x)

    @property
    def image_size(self) -> int:
        return int(self.train_x[0].shape[-1])

    def checksum(self) -> str:
        """sha256 over every client's train and test images and labels, in client order."""
        h = hashlib.sha256()
        for parts in zip(self.train_x, self.train_y, self.test_x, self.test_y, strict=True):
            for a in parts:
                h.update(np.ascontiguousarray(a).data)
        return h.hexdigest()

    def stats(self) -> dict[str, Any]:
        return {
            "spec": self.spec.to_dict(),
            "num_classes": self.num_classes,
            "groups": self.groups.tolist(),
            "group_names": self.group_names,
            "train_sizes": [int(len(y)) for y in self.train_y],
            "test_sizes": [int(len(y)) for y in self.test_y],
            "classes_per_client": [int(len(np.unique(y))) for y in self.train_y],
            "dataset_checksums": self.dataset_checksums,
        }


def _to_common(images: np.ndarray, size: int) -> np.ndarray:
    """uint8 NCHW -> uint8 (N, 3, size, size): grey repeated to RGB, bilinear resize."""
    if images.shape[1] == 1:
        images = np.repeat(images, 3, axis=1)
    if images.shape[-1] == size and images.shape[-2] == size:
        return np.ascontiguousarray(images)
    x = torch.from_numpy(images).float()
    x = F.interpolate(x, size=(size, size), mode="bilinear", align_corners=False, antialias=True)
    return x.round().clamp(0, 255).to(torch.uint8).numpy()


def _class_sets(spec: PopulationSpec, ds: ImageDataset) -> tuple[list[list[int]], list[str]]:
    k, n = spec.num_groups, ds.num_classes
    if k > n:
        raise PopulationError(f"num_groups={k} is more than the {n} classes of {ds.name}")
    if spec.grouping == "contiguous":
        blocks = np.array_split(np.arange(n), k)
        return [b.tolist() for b in blocks], [f"classes {b[0]}-{b[-1]}" for b in blocks]
    sem = semantic_groups(ds.name)
    if len(sem) < k:
        raise PopulationError(
            f"grouping='semantic' needs at least num_groups={k} semantic groups, {ds.name} has "
            f"{len(sem)}; use grouping='contiguous' or fewer groups"
        )
    index = {c: i for i, c in enumerate(ds.classes)}
    sets: list[list[int]] = [[] for _ in range(k)]
    names: list[list[str]] = [[] for _ in range(k)]
    for j, (group, members) in enumerate(sem.items()):  # dealt round-robin
        sets[j % k] += [index[c] for c in members]
        names[j % k].append(group)
    return [sorted(s) for s in sets], ["+".join(g) for g in names]


def _with_overlap(sets: list[list[int]], names: list[str], overlap: float):
    """Group g's classes and the lowest-numbered ``overlap`` share of group g+1's (a ring)."""
    if not overlap:
        return sets, names
    k = len(sets)
    extra = [sets[(g + 1) % k][: round(overlap * len(sets[(g + 1) % k]))] for g in range(k)]
    names = [f"{names[g]} + {round(overlap * 100)}% of group {(g + 1) % k}" for g in range(k)]
    return [sorted(set(sets[g]) | set(extra[g])) for g in range(k)], names


def _deal_shared(
    labels: np.ndarray, sub: np.ndarray, sets: list[list[int]], rng: np.random.RandomState
) -> list[np.ndarray]:
    """Every group's pool of sample indices: a class held by several groups has its samples
    shuffled and dealt evenly between them (no sample in two groups)."""
    pools: list[list[np.ndarray]] = [[] for _ in sets]
    for c in np.unique(labels[sub]):
        holders = [g for g, classes in enumerate(sets) if c in classes]
        if not holders:
            continue
        idx = sub[labels[sub] == c]
        if len(holders) > 1:  # (a class of one group draws nothing: disjoint groups as before)
            idx = idx[rng.permutation(len(idx))]
        for g, part in zip(holders, np.array_split(idx, len(holders)), strict=True):
            pools[g].append(part)
    return [np.sort(np.concatenate(p)) if p else np.zeros(0, np.int64) for p in pools]


def _split_group(
    labels: np.ndarray,
    pool: np.ndarray,
    n_clients: int,
    spec: PopulationSpec,
    rng: np.random.RandomState,
) -> list[np.ndarray]:
    """Split one group's pool of sample indices over its clients."""
    if spec.within_group_alpha is None:
        perm = pool[rng.permutation(len(pool))]
        return [np.sort(p) for p in np.array_split(perm, n_clients)]
    local = np.unique(labels[pool], return_inverse=True)[1]
    min_size = max(4, int(len(pool) / n_clients / 4))
    parts = dirichlet_partition(local, n_clients, spec.within_group_alpha, min_size, rng)
    return [pool[p] for p in parts]


def build_population(
    spec: PopulationSpec,
    datasets: dict[str, ImageDataset] | None = None,
    data: dict[str, str] | None = None,
) -> Population:
    """Draw the population of ``spec``.

    ``datasets`` supplies already loaded datasets by name (tests pass synthetic ones);
    others are loaded with `load_dataset`, from ``data[name]`` when given.
    """
    spec.validate()
    datasets = dict(datasets or {})
    loaded: dict[str, ImageDataset] = {}
    for name in spec.datasets:
        key = dataset_info(name).name
        given = datasets.get(name, datasets.get(key))
        loaded[name] = given if given is not None else load_dataset(key, (data or {}).get(name))
    rng = np.random.RandomState(spec.seed)
    groups = np.arange(spec.num_clients) % spec.groups
    members = [np.flatnonzero(groups == g) for g in range(spec.groups)]
    train_x: list[np.ndarray] = [np.zeros(0)] * spec.num_clients
    train_y, test_x, test_y = list(train_x), list(train_x), list(train_x)

    def assign(ds: ImageDataset, pool: np.ndarray, clients: np.ndarray, offset: int) -> None:
        images, labels = merge_splits(ds)
        parts = _split_group(labels, pool, len(clients), spec, rng)
        tr, te = split_clients(parts, spec.train_ratio, rng)
        for c, a, b in zip(clients, tr, te, strict=True):
            train_x[c] = _to_common(images[a], spec.image_size)
            test_x[c] = _to_common(images[b], spec.image_size)
            train_y[c], test_y[c] = labels[a] + offset, labels[b] + offset

    if spec.kind == "label-groups":
        ds = loaded[spec.datasets[0]]
        labels = np.concatenate([ds.train_labels, ds.test_labels])
        sub = stratified_subsample(labels, spec.fraction, rng)
        sets, group_names = _with_overlap(*_class_sets(spec, ds), spec.overlap)
        for g, pool in enumerate(_deal_shared(labels, sub, sets, rng)):
            if len(pool) < 2 * len(members[g]):
                raise PopulationError(
                    f"group {g} has only {len(pool)} samples for {len(members[g])} clients; "
                    "raise fraction or lower num_clients"
                )
            assign(ds, pool, members[g], 0)
        num_classes, class_names = ds.num_classes, list(ds.classes)
    else:
        num_classes, class_names, group_names, offset = 0, [], [], 0
        for g, name in enumerate(spec.datasets):
            ds = loaded[name]
            labels = np.concatenate([ds.train_labels, ds.test_labels])
            pool = stratified_subsample(labels, spec.fraction, rng)
            assign(ds, pool, members[g], offset)
            group_names.append(ds.name)
            if spec.label_space == "disjoint":
                class_names += [f"{ds.name}:{c}" for c in ds.classes]
                offset += ds.num_classes
                num_classes = offset
            else:
                num_classes = max(num_classes, ds.num_classes)
        if spec.label_space == "shared":
            class_names = [f"class {k}" for k in range(num_classes)]
    return Population(
        spec=spec,
        num_classes=num_classes,
        class_names=class_names,
        train_x=train_x,
        train_y=[y.astype(np.int64) for y in train_y],
        test_x=test_x,
        test_y=[y.astype(np.int64) for y in test_y],
        groups=groups,
        group_names=group_names,
        dataset_checksums={n: d.checksum for n, d in loaded.items()},
    )

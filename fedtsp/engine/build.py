"""What every engine builds the same way before round 0: every client's data (a Dirichlet
partition of one dataset, or a population with planted groups), each client's model and
`Client`, the method's run context and its two halves (`client_half`, `server_half`: the
one place either is made). Sharing these is what makes a Flower run start where the
simulator starts, weight for weight."""

from __future__ import annotations

import contextlib
import functools
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedtsp.algorithms import RunContext, get_algorithm, resolve_options
from fedtsp.algorithms.base import ClientHalf, ServerHalf
from fedtsp.algorithms.clients import Client
from fedtsp.core import isa
from fedtsp.core.config import RunConfig
from fedtsp.core.paths import portable_path
from fedtsp.core.seeding import rng_state, seed_everything
from fedtsp.data import (
    ImageDataset,
    Partition,
    load_dataset,
    make_partition,
    stratified_subsample,
)
from fedtsp.data.populations import build_population
from fedtsp.engine.runspec import data_names, population_spec
from fedtsp.models.families import ClientModel, build_client_model

# A run's loaded data: its dataset, or a population's datasets by name.
Datasets = ImageDataset | dict[str, ImageDataset]
Arrays = tuple[np.ndarray, np.ndarray]  # uint8 images, int64 labels


def partition_dataset(
    config: RunConfig, dataset: ImageDataset
) -> tuple[np.ndarray, np.ndarray, Partition]:
    """Merge the official splits and draw the config's Dirichlet partition over them."""
    images = np.concatenate([dataset.train_images, dataset.test_images])
    labels = np.concatenate([dataset.train_labels, dataset.test_labels])
    partition = make_partition(
        labels,
        dataset.num_classes,
        config.num_clients,
        config.alpha,
        batch_size=config.batch_size,
        train_ratio=config.train_ratio,
        seed=config.partition_seed,
        fraction=config.fraction,
        min_size=config.min_client_samples,
    )
    return images, labels, partition


def global_test_indices(config: RunConfig, dataset: ImageDataset) -> np.ndarray:
    """The global test set: the official (class-balanced) test split; with a data fraction
    < 1 the same stratified fraction of it, which keeps it balanced and its cost in step."""
    return stratified_subsample(dataset.test_labels, config.fraction, config.partition_seed)


def needs_global_test(config: RunConfig) -> bool:
    return config.global_eval_every > 0 or config.setting == "gfl"


@dataclass
class ClientData:
    """Every client's images and labels, and what a run record says about them."""

    train: list[Arrays]
    test: list[Arrays]
    class_names: list[str]
    channels: int
    image_size: int
    description: dict[str, Any]  # the record's "dataset": name, source, checksum, classes
    stats: dict[str, Any]  # the record's "partition"
    global_test: Arrays | None = None  # the balanced official test set (needs_global_test)
    groups: list[int] | None = None  # a population's planted group of every client


def load_datasets(
    config: RunConfig, data: str | Path | None = None, given: Datasets | None = None
) -> dict[str, ImageDataset]:
    """Every dataset the run reads (`data_names`): from ``given``, else loaded (``data``
    locates the run's own dataset; a population's others come from their default places)."""
    if isinstance(given, ImageDataset):
        given = {config.dataset: given}
    given = given or {}
    return {
        name: given[name]
        if name in given
        else load_dataset(name, data if name == config.dataset else None)
        for name in data_names(config)
    }


def data_identity(config: RunConfig, datasets: dict[str, ImageDataset]) -> dict[str, Any]:
    """What a run key hashes of the data: every dataset's checksum."""
    identity: dict[str, Any] = {"dataset_checksum": datasets[config.dataset].checksum}
    others = {n: d.checksum for n, d in sorted(datasets.items()) if n != config.dataset}
    return identity | ({"population_checksums": others} if others else {})


def client_data(config: RunConfig, datasets: dict[str, ImageDataset]) -> ClientData:
    """The clients' data of a run: its Dirichlet partition, or its population."""
    if config.population is not None:
        pop = build_population(population_spec(config), datasets=datasets)
        sources = [portable_path(datasets[n].source) for n in pop.spec.datasets]
        return ClientData(
            train=list(zip(pop.train_x, pop.train_y, strict=True)),
            test=list(zip(pop.test_x, pop.test_y, strict=True)),
            class_names=pop.class_names,
            channels=3,
            image_size=pop.image_size,
            description={
                "name": config.population,
                "source": " + ".join(sources),
                "checksum": pop.checksum(),
                "classes": pop.class_names,
            },
            stats=pop.stats(),
            groups=pop.groups.tolist(),
        )
    dataset = datasets[config.dataset]
    images, labels, partition = partition_dataset(config, dataset)
    global_test = None
    if needs_global_test(config):
        idx = global_test_indices(config, dataset)
        global_test = (dataset.test_images[idx], dataset.test_labels[idx])
    return ClientData(
        train=[(images[i], labels[i]) for i in partition.client_train],
        test=[(images[i], labels[i]) for i in partition.client_test],
        class_names=list(dataset.classes),
        channels=dataset.channels,
        image_size=dataset.image_size,
        description={
            "name": dataset.name,
            "source": portable_path(dataset.source),
            "checksum": dataset.checksum,
            "classes": list(dataset.classes),
        },
        stats=partition.stats(),
        global_test=global_test,
    )


def run_context(
    config: RunConfig,
    class_names: list[str],
    feature_dim: int,
    groups: list[int] | None = None,
) -> RunContext:
    return RunContext(
        dataset=config.dataset,
        class_names=list(class_names),
        feature_dim=feature_dim,
        num_clients=config.num_clients,
        rounds=config.rounds,
        device=torch.device(config.device),
        seed=config.seed,
        setting=config.setting,
        groups=groups,
        family=config.family,
    )


def client_half(config: RunConfig, ctx: RunContext) -> ClientHalf:
    """The method's client half for this run."""
    options = resolve_options(config.algorithm, config.algo_options)
    return get_algorithm(config.algorithm).Client(options, ctx)


def server_half(config: RunConfig, ctx: RunContext) -> ServerHalf:
    """The method's server half for this run."""
    options = resolve_options(config.algorithm, config.algo_options)
    return get_algorithm(config.algorithm).Server(options, ctx)


def cpu_has_native_bf16() -> bool:
    """Whether this CPU computes bfloat16 natively (AVX512-BF16 or AMX; read on Linux)."""
    try:
        flags = set(Path("/proc/cpuinfo").read_text().split())
    except OSError:
        return False
    return bool(flags & {"avx512_bf16", "amx_bf16"})


def autocast_factory(config: RunConfig) -> Any:
    if config.precision == "fp32":
        return contextlib.nullcontext
    device_type = torch.device(config.device).type
    if device_type == "cpu" and (isa.state().pinned or not cpu_has_native_bf16()):
        warnings.warn(
            "precision=bf16 on a CPU without native bf16 (AVX512-BF16 or AMX), or with the "
            "kernels pinned to AVX2: autocast is emulated here and several times slower than "
            "fp32 (FEDTSP_ISA=native uses the CPU's own bf16)",
            stacklevel=2,
        )
    return functools.partial(torch.autocast, device_type=device_type, dtype=torch.bfloat16)


def client_model(
    config: RunConfig,
    index: int,
    num_classes: int,
    feature_dim: int,
    channels: int,
    image_size: int,
) -> ClientModel:
    """Client ``index``'s model; under ``client_init="shared"`` torch is reseeded with the
    run's seed first, so every client of one architecture starts identical."""
    if config.client_init == "shared":
        torch.manual_seed(config.seed)
    return build_client_model(
        config.family,
        index,
        num_classes,
        feature_dim=feature_dim,
        in_channels=channels,
        image_size=image_size,
    ).to(config.device)


def initial_models(
    config: RunConfig, num_classes: int, feature_dim: int, channels: int, image_size: int
) -> tuple[list[ClientModel], dict[str, Any]]:
    """Every client's starting model, built in client order from the run seed, and the RNG
    state right after them: the stream both halves' set-up draws continue from, on every
    engine (``set_up_client``, ``set_up_server``)."""
    seed_everything(config.seed)
    models = [
        client_model(config, i, num_classes, feature_dim, channels, image_size)
        for i in range(config.num_clients)
    ]
    return models, rng_state()


def make_client(
    config: RunConfig,
    index: int,
    model: ClientModel,
    train: tuple[torch.Tensor, torch.Tensor],
    test: tuple[torch.Tensor, torch.Tensor],
    num_classes: int,
) -> Client:
    """A `Client` batching as RunConfig.batch_order and undersized_clients say."""
    return Client(
        index,
        model,
        *train,
        *test,
        num_classes,
        autocast=autocast_factory(config),
        shuffle=config.batch_order == "shuffled",
        train_undersized=config.undersized_clients == "train",
    )

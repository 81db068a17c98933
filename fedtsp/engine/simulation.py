"""The in-process federated simulator: every client's data and model live in memory.

The run is the engine's (:func:`fedtsp.engine.driver.drive`, the one driver of every
transport); this module builds a run in memory and is its in-process transport: the client
halves run here, phase by phase over all clients (set-up; then evaluate all, train all,
upload all), on the method's client half, which shares nothing with its server half but
messages. ``client_workers`` > 1 spreads the same clients over processes
(``engine.client_pool``).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedtsp.algorithms import Message
from fedtsp.algorithms.base import ClientHalf, ServerHalf
from fedtsp.algorithms.clients import Client
from fedtsp.core.config import RunConfig
from fedtsp.core.results import RunStore
from fedtsp.data import ImageDataset, device_images
from fedtsp.engine import runspec
from fedtsp.engine.build import (
    ClientData,
    Datasets,
    client_data,
    client_half,
    data_identity,
    initial_models,
    load_datasets,
    make_client,
    run_context,
    server_half,
)
from fedtsp.engine.client_pool import ClientPool, check_client_workers
from fedtsp.engine.client_round import (
    ClientReply,
    GlobalTest,
    RoundWork,
    clients_round,
    deliver_to,
    restore_client,
    set_up_client,
)
from fedtsp.engine.driver import Run, drive, setup_bytes, start
from fedtsp.engine.loop import RoundLoop, check_every
from fedtsp.engine.runspec import check_run, method_feature_dim

log = logging.getLogger("fedtsp")


class InProcess:
    """The simulator's transport: every client half runs here, phase by phase."""

    def __init__(
        self,
        config: RunConfig,
        clients: list[Client],
        half: ClientHalf,
        global_test: GlobalTest | None,
    ) -> None:
        self.config, self.clients, self.half, self.global_test = config, clients, half, global_test
        self.failures: list[Any] = []  # a client here never goes missing

    def set_up(self, rng: dict[str, Any]) -> dict[int, Any]:
        return {c.index: set_up_client(self.half, c, self.config, rng) for c in self.clients}

    def restore(
        self, rng: dict[str, Any], states: dict[int, Any], pending: dict[int, Message]
    ) -> None:
        for client in self.clients:
            restore_client(self.half, client, self.config, rng, states[client.index])
        self.deliver(pending)

    def client_round(self, work: RoundWork) -> dict[int, ClientReply]:
        return clients_round(self.half, self.clients, self.config, work, self.global_test)

    def deliver(self, messages: dict[int, Message]) -> float:
        return deliver_to(self.half, self.clients, messages)

    def snapshot(self) -> tuple[dict[int, Any], dict[int, Message]]:
        return {c.index: c.state_dict() for c in self.clients}, {}  # all delivered at once

    def analysis_artifacts(self) -> dict[str, torch.Tensor]:
        return self.half.analysis_artifacts(self.clients)

    def close(self) -> None:
        """Nothing to release."""


def run_key(config: RunConfig, dataset: Datasets) -> str:
    """The run's identity: its full config plus the exact data it trains on (``dataset``:
    the run's dataset, or for a population its datasets by name)."""
    datasets = dataset if isinstance(dataset, dict) else {config.dataset: dataset}
    return runspec.run_key(config, data_identity(config, datasets))


def build(
    config: RunConfig, datasets: dict[str, ImageDataset], key: str
) -> tuple[Run, InProcess, ClientData]:
    """A run in memory, not set up yet: its server side and every client (checked config)."""
    feature_dim = method_feature_dim(config)
    device = torch.device(config.device)
    cdata = client_data(config, datasets)

    def tensors(arrays: tuple[np.ndarray, np.ndarray]) -> tuple[torch.Tensor, torch.Tensor]:
        x = device_images(arrays[0], device, config.channels_last)
        return x, torch.from_numpy(arrays[1]).long().to(device)

    classes = len(cdata.class_names)
    models, rng = initial_models(config, classes, feature_dim, cdata.channels, cdata.image_size)
    clients = [
        make_client(config, i, model, tensors(cdata.train[i]), tensors(cdata.test[i]), classes)
        for i, model in enumerate(models)
    ]
    ctx = run_context(config, cdata.class_names, feature_dim, cdata.groups)
    server = server_half(config, ctx)
    run = Run(config, key, server, rng, cdata.description, cdata.stats, feature_dim)
    global_test = None if cdata.global_test is None else tensors(cdata.global_test)
    return run, InProcess(config, clients, client_half(config, ctx), global_test), cdata


@dataclass
class PreparedRun:
    """A run set up in memory, round 0 next (the set-up's first message delivered); exposed
    so tests and notebooks can drive its rounds and look inside.

    ``server`` is the method's server half, ``client_half`` the object every client hook
    runs on: two types that share only the messages the engine passes between them.
    """

    config: RunConfig
    key: str
    data: ClientData
    transport: InProcess
    server: ServerHalf
    first: dict[int, Message]  # what each client received after set-up
    setup: dict[str, float]  # the set-up messages' bytes (engine.driver.setup_bytes)

    @property
    def clients(self) -> list[Client]:
        return self.transport.clients

    @property
    def client_half(self) -> ClientHalf:
        return self.transport.half

    @property
    def global_test(self) -> GlobalTest | None:
        return self.transport.global_test

    def loop(self, transport: Any = None) -> RoundLoop:
        """The round loop over this run's clients (default: all of them in this process)."""
        return RoundLoop(
            self.server, transport or self.transport, self.config, [c.index for c in self.clients]
        )


def prepare(
    config: RunConfig, data: str | Path | None = None, dataset: Datasets | None = None
) -> PreparedRun:
    """Build and set up a run in memory (what ``run_experiment`` drives), for inspection."""
    check_run(config)
    datasets = load_datasets(config, data, dataset)
    run, transport, cdata = build(config, datasets, run_key(config, datasets))
    replies, first = start(run, transport)
    return PreparedRun(
        config, run.key, cdata, transport, run.server, first, setup_bytes(replies, first)
    )


def run_experiment(
    config: RunConfig,
    *,
    data: str | Path | None = None,
    out: str | Path = "runs",
    resume: bool = False,
    force: bool = False,
    progress: bool = True,
    dataset: ImageDataset | None = None,
    stop_after: int | None = None,
    checkpoint_every: int | None = None,
    client_workers: int = 1,
) -> dict[str, Any]:
    """Run (or fetch from the store) one federated experiment and return its record.

    ``client_workers`` > 1 runs the clients in that many processes with one thread each
    (``engine.client_pool``; faster for small models on a multi-core CPU, same history as
    this process at one thread).

    A checkpoint is written every ``checkpoint_every`` rounds, or, unset, whenever that keeps
    checkpoints near 1 % of the wall time (``engine.loop.CheckpointSchedule``); a resumed
    run repeats the rounds since and still ends identical.

    ``stop_after`` ends the process-equivalent of an interruption after that many rounds
    (the checkpoint stays; used by tests and for chunked runs).
    """
    wall_start = time.perf_counter()
    check_client_workers(client_workers)
    check_every(checkpoint_every)
    check_run(config)
    datasets = load_datasets(config, data, dataset)
    store = RunStore(out)
    key = run_key(config, datasets)
    cached = store.load(key)
    if cached is not None and not force:
        log.info("run %s found in %s; reusing it (force=True reruns)", key, out)
        cached["cache_hit"] = True
        return cached
    if not resume and not force:
        store.refuse_unfinished(key)  # before any work
    run, local, _ = build(config, datasets, key)
    transport = local if client_workers == 1 else ClientPool(local, client_workers)
    try:
        return drive(
            run,
            transport,
            store,
            resume=resume,
            force=force,
            stop_after=stop_after,
            checkpoint_every=checkpoint_every,
            progress=progress,
            environment={"client_workers": client_workers, "threads": 1}
            if client_workers > 1
            else None,
            wall_start=wall_start,
        )
    finally:
        transport.close()

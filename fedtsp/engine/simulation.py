"""The in-process federated simulator: every client's data and model live in memory.

The round itself is the engine's (:class:`fedtsp.engine.loop.RoundLoop`); this module is
its in-process transport: the client halves run here, phase by phase over all clients
(set-up; then evaluate all, train all, upload all), on a client-side copy of the method
that shares nothing with the server's copy but messages. A checkpoint is written after every round;
the random state of round t is derived from (seed, t) alone, so a resumed run continues
exactly as an uninterrupted one would.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedtsp.algorithms import Message, get_algorithm, resolve_options
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
    data_identity,
    initial_models,
    load_datasets,
    make_client,
    resolve_feature_dim,
    run_context,
)
from fedtsp.engine.client_pool import ClientPool, check_client_workers
from fedtsp.engine.client_round import (
    ClientReply,
    RoundWork,
    clients_round,
    deliver_to,
    set_up_client,
)
from fedtsp.engine.loop import CheckpointSchedule, RoundLoop, set_up_server, setup_bytes
from fedtsp.engine.record import federated_record
from fedtsp.engine.runspec import check_run

log = logging.getLogger("fedtsp")


@dataclass
class PreparedRun:
    """Everything built before round 0; exposed so tests and notebooks can inspect it.

    ``server`` is the method's server half, ``client_half`` the object every client hook
    runs on: two types that share only the messages the engine passes between them.
    """

    config: RunConfig
    key: str
    data: ClientData
    clients: list[Client]
    server: ServerHalf
    client_half: ClientHalf
    first_broadcast: Message | None
    global_test: tuple[torch.Tensor, torch.Tensor] | None
    setup: dict[str, float]  # the set-up messages' bytes (engine.loop.setup_bytes)

    def loop(self, transport: InProcess | ClientPool | None = None) -> RoundLoop:
        """The round loop over this run's clients (default: all of them in this process)."""
        return RoundLoop(
            self.server,
            transport or InProcess(self),
            self.config,
            [c.index for c in self.clients],
        )


class InProcess:
    """The simulator's transport: every client half runs here, phase by phase."""

    def __init__(self, run: PreparedRun) -> None:
        self.run = run

    def client_round(self, work: RoundWork) -> dict[int, ClientReply]:
        run = self.run
        return clients_round(run.client_half, run.clients, run.config, work, run.global_test)

    def deliver(self, messages: dict[int, Message]) -> float:
        return deliver_to(self.run.client_half, self.run.clients, messages)

    def sync(self) -> None:
        """The clients' states are in ``run.clients`` already."""

    def close(self) -> None:
        """Nothing to release."""


def run_key(config: RunConfig, dataset: Datasets) -> str:
    """The run's identity: its full config plus the exact data it trains on (``dataset``:
    the run's dataset, or for a population its datasets by name)."""
    datasets = dataset if isinstance(dataset, dict) else {config.dataset: dataset}
    return runspec.run_key(config, data_identity(config, datasets))


def prepare(
    config: RunConfig, data: str | Path | None = None, dataset: Datasets | None = None
) -> PreparedRun:
    check_run(config)
    algorithm_cls = get_algorithm(config.algorithm)
    options = resolve_options(config.algorithm, config.algo_options)
    feature_dim = resolve_feature_dim(config, algorithm_cls, options)
    datasets = load_datasets(config, data, dataset)
    key = run_key(config, datasets)
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
    client_half = algorithm_cls.Client(options, ctx)
    replies = {c.index: set_up_client(client_half, c, config, rng) for c in clients}
    server = algorithm_cls.Server(options, ctx)
    first = set_up_server(server, replies, rng)
    global_test = None if cdata.global_test is None else tensors(cdata.global_test)
    return PreparedRun(
        config,
        key,
        cdata,
        clients,
        server,
        client_half,
        first,
        global_test,
        setup_bytes(replies, first),
    )


def _save_checkpoint(store: RunStore, run: PreparedRun, round_index: int, history: list) -> None:
    state = {
        "round": round_index,
        "clients": [c.state_dict() for c in run.clients],
        "algorithm": run.server.state_dict(),
        "history": history,
    }
    store.save_checkpoint(run.key, state)


def _load_checkpoint(store: RunStore, run: PreparedRun) -> tuple[int, list]:
    state = store.load_checkpoint(run.key, run.config.device)
    for client, saved in zip(run.clients, state["clients"], strict=True):
        client.load_state_dict(saved)
    run.server.load_state_dict(state["algorithm"])
    return state["round"], state["history"]


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
    schedule = CheckpointSchedule(config, checkpoint_every, stop_after)
    check_client_workers(client_workers)
    check_run(config)
    datasets = load_datasets(config, data, dataset)
    store = RunStore(out)
    cached = store.load(run_key(config, datasets))
    if cached is not None and not force:
        log.info("run %s found in %s; reusing it (force=True reruns)", cached["key"], out)
        cached["cache_hit"] = True
        return cached
    run = prepare(config, dataset=datasets)
    transport = InProcess(run) if client_workers == 1 else ClientPool(run, client_workers)
    try:
        loop = run.loop(transport)
        ckpt_path = store.checkpoint_path(run.key)
        history: list[dict[str, Any]] = []
        start_round = 0
        if ckpt_path.exists() and not force:
            if not resume:
                store.refuse_unfinished(run.key)
            done, history = _load_checkpoint(store, run)
            start_round = done + 1
            log.info("resuming run %s after round %d", run.key, done)
        else:
            loop.start(run.first_broadcast)

        cfg = run.config
        stop = cfg.rounds + 1 if stop_after is None else min(stop_after, cfg.rounds + 1)

        def checkpoint(t: int, row: dict[str, Any]) -> None:
            if schedule.due(t):
                start = time.perf_counter()
                transport.sync()
                _save_checkpoint(store, run, t, history)
                row["timings"]["checkpoint"] = time.perf_counter() - start
                schedule.saved(row["timings"]["checkpoint"])

        desc = f"{cfg.algorithm} {cfg.dataset}"
        loop.run(start_round, stop, history, checkpoint, progress=progress, desc=desc)
        if stop <= cfg.rounds:
            return {"key": run.key, "interrupted_after_round": stop - 1, "history": history}

        transport.sync()
        record = federated_record(
            key=run.key,
            status="complete",
            config=cfg,
            algo_options=run.server.opts,
            feature_dim=run.server.ctx.feature_dim,
            dataset=run.data.description,
            partition=run.data.stats,
            history=history,
            wall_seconds=time.perf_counter() - wall_start,
            server=run.server.record_extras(),
            setup=run.setup,
            environment={"client_workers": client_workers, "threads": 1}
            if client_workers > 1
            else None,
        )
        produced = run.server.artifacts() | run.client_half.analysis_artifacts(run.clients)
        artifacts = {k: v.detach().cpu().float().numpy() for k, v in produced.items()}
        store.save(record, artifacts)
        ckpt_path.unlink(missing_ok=True)
        return record
    finally:
        transport.close()

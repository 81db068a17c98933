"""The one run driver of every transport: set up or resume, the rounds with their checkpoint
schedule, the record.

A transport decides where the client halves run: in this process (``InProcess``), in client
processes (``ClientPool``) or on Flower nodes (``FlowerTransport``). Whatever it is, a run
goes the same way (``drive``):

    fresh:   transport.set_up -> server set-up from the facts and uploads -> first message
    resumed: server set-up again from the saved set-up uploads, its state loaded;
             transport.restore(the clients' saved states, the messages not yet received)
    rounds:  RoundLoop; after a round the schedule may save a checkpoint (the server's
             state, transport.snapshot(), the history)
    end:     the record (and the server's artefacts) into the run store

Each round's randomness is a function of (seed, round) alone, so a resumed run repeats the
rounds since the last checkpoint and ends identical to an uninterrupted one.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch

from fedtsp.algorithms.base import Message, ServerHalf
from fedtsp.algorithms.clients import ClientFacts
from fedtsp.core import isa
from fedtsp.core.config import RunConfig
from fedtsp.core.results import RunStore, RunStoreError
from fedtsp.core.seeding import set_rng_state
from fedtsp.engine.client_round import ClientReply, RoundWork, SetupReply
from fedtsp.engine.loop import CheckpointSchedule, RoundLoop
from fedtsp.engine.messages import message_nbytes
from fedtsp.engine.record import federated_record

log = logging.getLogger("fedtsp")


class Transport(Protocol):
    """Where the client halves run."""

    failures: list[Any]  # clients lost so far (Flower); a run with failures is not nominal

    def set_up(self, rng: dict[str, Any]) -> dict[int, SetupReply]:
        """Every client set up afresh: its facts and set-up upload."""
        ...

    def restore(
        self, rng: dict[str, Any], states: dict[int, Any], pending: dict[int, Message]
    ) -> None:
        """Every client as a checkpoint saved it (set up from ``rng``, then loaded), with
        the messages it had not yet received."""
        ...

    def client_round(self, work: RoundWork) -> dict[int, ClientReply]:
        """Every reachable client's reply to one round (missing: a client that failed)."""
        ...

    def deliver(self, messages: dict[int, Message]) -> float:
        """Hand each client its message (at once, or with the next round); seconds spent."""
        ...

    def snapshot(self) -> tuple[dict[int, Any], dict[int, Message]]:
        """Every client's state (``Client.state_dict``) and the messages not yet received."""
        ...

    def analysis_artifacts(self) -> dict[str, torch.Tensor]:
        """The client half's analysis tensors over every client (where all are at hand)."""
        ...

    def close(self) -> None: ...


@dataclass
class Run:
    """The server side of a run, the same on every transport: its config and key, the
    method's server half (not set up yet), the set-up RNG state and what its record says
    of the data."""

    config: RunConfig
    key: str
    server: ServerHalf
    rng: dict[str, Any]  # the RNG state after the models (engine.build.initial_models)
    dataset: dict[str, Any]  # the record's "dataset"
    partition: dict[str, Any]  # the record's "partition"
    feature_dim: int


def set_up_server(
    server: ServerHalf, replies: dict[int, SetupReply], rng: dict[str, Any]
) -> Message | None:
    """The method's server set-up from the clients' facts and set-up uploads (client order);
    its draws continue the run's stream after the models (``rng``), as the clients' do."""
    order = sorted(replies)
    set_rng_state(rng)
    return server.setup([replies[i].facts for i in order], {i: replies[i].upload for i in order})


def setup_bytes(replies: dict[int, SetupReply], first: dict[int, Message]) -> dict[str, float]:
    """The set-up's traffic per client, as the record keeps it beside the rounds'."""
    ups = [message_nbytes(r.upload) for r in replies.values()]
    downs = [message_nbytes(first.get(i)) for i in replies]
    return {"bytes_up_per_client": float(np.mean(ups)), "bytes_down": float(np.mean(downs))}


def start(run: Run, transport: Transport) -> tuple[dict[int, SetupReply], dict[int, Message]]:
    """A fresh run's set-up: every client's, then the server's; then each client receives
    its first message, if any."""
    replies = transport.set_up(run.rng)
    first = run.server.first_messages(sorted(replies), set_up_server(run.server, replies, run.rng))
    if first:
        transport.deliver(first)
    return replies, first


def run_record(
    run: Run,
    history: list[dict[str, Any]],
    status: str,
    wall_seconds: float,
    environment: dict[str, Any] | None = None,
    extra: dict[str, Any] | None = None,
    setup: dict[str, float] | None = None,
) -> dict[str, Any]:
    """The run's record as it stands (``status``: complete, running, interrupted, failed)."""
    return federated_record(
        key=run.key,
        status=status,
        config=run.config,
        algo_options=run.server.opts,
        feature_dim=run.feature_dim,
        dataset=run.dataset,
        partition=run.partition,
        history=history,
        wall_seconds=wall_seconds,
        environment=environment,
        server=run.server.record_extras(),
        setup=setup,
        extra=extra,
    )


def drive(
    run: Run,
    transport: Transport,
    store: RunStore,
    *,
    resume: bool = False,
    force: bool = False,
    stop_after: int | None = None,
    checkpoint_every: int | None = None,
    progress: bool = False,
    environment: dict[str, Any] | None = None,
    extra: Callable[[], dict[str, Any]] | None = None,
    after_round: Callable[[int, dict[str, Any], list[dict[str, Any]]], None] | None = None,
    wall_start: float | None = None,
) -> dict[str, Any]:
    """Run ``run`` on ``transport`` (resuming its checkpoint with ``resume``) and return its
    record, saved in ``store``; a run cut short by ``stop_after`` returns its history.

    ``extra()``: facts the record adds (e.g. Flower's nodes and failures); ``after_round``
    runs after each round's checkpoint. A run whose transport lost clients is kept beside
    the store (``RunStore.save_incomplete``), never served as a cache hit.
    """
    wall_start = time.perf_counter() if wall_start is None else wall_start
    cfg = run.config
    schedule = CheckpointSchedule(cfg, checkpoint_every, stop_after)
    path = store.checkpoint_path(run.key)
    setup_start = time.perf_counter()
    if path.exists() and not force:
        if not resume:
            store.refuse_unfinished(run.key)
        saved = store.load_checkpoint(run.key, cfg.device)
        if "setup" not in saved:
            raise RunStoreError(
                f"checkpoint {path} was written by an older fedtsp; rerun with --force "
                "(force=True) to restart the run"
            )
        if saved.get("isa") != isa.tag():  # the rounds after it would use other kernels
            raise RunStoreError(
                f"checkpoint {path} was written with the CPU kernels "
                f"{saved.get('isa') or 'of an older fedtsp (not recorded)'}, this process "
                f"runs {isa.tag()}; resume it with the same {isa.CHOICE} on a like machine, "
                "or rerun with --force to restart it"
            )
        replies = {
            i: SetupReply(ClientFacts.from_json(facts), upload)
            for i, (facts, upload) in saved["setup"].items()
        }
        broadcast = set_up_server(run.server, replies, run.rng)
        first = run.server.first_messages(sorted(replies), broadcast)
        run.server.load_state_dict(saved["server"])
        transport.restore(run.rng, saved["clients"], saved["pending"])
        done, history = saved["round"] + 1, saved["history"]
        log.info("resuming run %s after round %d", run.key, saved["round"])
    else:
        replies, first = start(run, transport)
        done, history = 0, []
    setup_seconds = time.perf_counter() - setup_start  # (one-shot methods embed, cluster here)
    loop = RoundLoop(run.server, transport, cfg, sorted(replies))

    def checkpoint(t: int, row: dict[str, Any]) -> None:
        if schedule.due(t) and not transport.failures:
            begin = time.perf_counter()
            states, pending = transport.snapshot()
            store.save_checkpoint(
                run.key,
                {
                    "round": t,
                    "isa": isa.tag(),  # a resume must run the same kernels
                    # The set-up's inputs: a resumed server sets up again from them, then loads.
                    "setup": {i: (r.facts.to_json(), r.upload) for i, r in replies.items()},
                    "server": run.server.state_dict(),
                    "clients": states,
                    "pending": pending,
                    "history": history,
                },
            )
            row["timings"]["checkpoint"] = time.perf_counter() - begin
            schedule.saved(row["timings"]["checkpoint"])
        if after_round is not None:
            after_round(t, row, history)

    stop = cfg.rounds + 1 if stop_after is None else min(stop_after, cfg.rounds + 1)
    desc = f"{cfg.algorithm} {cfg.dataset}"
    loop.run(done, stop, history, checkpoint, progress=progress, desc=desc)
    if stop <= cfg.rounds:
        return {"key": run.key, "interrupted_after_round": stop - 1, "history": history}
    failed = bool(transport.failures)
    record = run_record(
        run,
        history,
        "complete_with_failures" if failed else "complete",
        time.perf_counter() - wall_start,
        environment,
        extra() if extra is not None else None,
        setup_bytes(replies, first) | {"seconds": setup_seconds},
    )
    if failed:
        store.save_incomplete(record)
        return record
    produced = run.server.artifacts() | transport.analysis_artifacts()
    store.save(record, {k: v.detach().cpu().float().numpy() for k, v in produced.items()})
    store.incomplete_path(run.key).unlink(missing_ok=True)
    path.unlink(missing_ok=True)
    return record

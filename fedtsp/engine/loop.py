"""The one round loop of every engine (the run driver, ``engine.driver``, calls it).

A round t, on the server::

    transport.client_round(work)             every client: evaluate, train, upload (its
                                             global RNG seeded from (seed, t))
    seed(seed, t) -> server.aggregate(t, uploads)   the method's server half
                  -> server.configure(t + 1, client ids)    one message per client
                  -> transport.deliver(messages)            every client: receive

The transport decides where the client halves run: in this process (the simulator), in
client processes or on Flower nodes. All build the same history row, so their records
compare key by key.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
from tqdm.auto import tqdm

from fedtsp.algorithms.base import ServerHalf
from fedtsp.core.config import ConfigError, RunConfig
from fedtsp.core.seeding import derive_seed, seed_everything
from fedtsp.engine.client_round import ClientReply, RoundWork
from fedtsp.engine.messages import message_nbytes

if TYPE_CHECKING:
    from fedtsp.engine.driver import Transport

PHASES = ("evaluate", "train", "upload", "server", "broadcast", "checkpoint")


def global_eval_due(config: RunConfig, round_index: int) -> bool:
    """Whether round `round_index` also scores every client on the global test set: every
    `global_eval_every` rounds after training started, and after the last round."""
    k = config.global_eval_every
    return k > 0 and ((round_index > 0 and round_index % k == 0) or round_index == config.rounds)


def checkpoint_due(
    config: RunConfig, round_index: int, every: int, stop_after: int | None = None
) -> bool:
    """Whether the state after round `round_index` is saved: every `every` rounds, and where
    a run is cut short on purpose (`stop_after` rounds); never after the closing round."""
    done = round_index + 1
    return round_index < config.rounds and (done % every == 0 or stop_after == done)


def check_every(every: int | None) -> int | None:
    """A checkpoint period: None (automatic) or an integer >= 1, else a one-line ConfigError
    (callers check it before any work)."""
    if every is not None and (isinstance(every, bool) or every < 1):
        raise ConfigError(f"checkpoint_every={every} is invalid; must be >= 1 (or unset)")
    return every


# Auto checkpoints ("every" unset) keep their cost near this share of a run's wall time.
CHECKPOINT_SHARE = 0.01


class CheckpointSchedule:
    """Which rounds end with a checkpoint.

    ``every=k``: every k rounds. ``every=None`` (auto): after the first round, then as soon
    as the rounds since the last save took 1 / CHECKPOINT_SHARE times that save's cost. Small
    models are then saved every round; 20 HtFE2 models (2 s a save on 2 cores) every few
    minutes. Either way a run cut short on purpose (``stop_after``) saves where it stops, and
    a resumed run repeats the rounds since the last save and ends identical, because each
    round's randomness is a function of (seed, round) alone.
    """

    def __init__(self, config: RunConfig, every: int | None, stop_after: int | None = None) -> None:
        self.config, self.every, self.stop_after = config, check_every(every), stop_after
        self.cost = 0.0  # seconds the last save took
        self.last = time.perf_counter()

    def due(self, round_index: int) -> bool:
        if self.every is not None:
            return checkpoint_due(self.config, round_index, self.every, self.stop_after)
        if round_index >= self.config.rounds:
            return False
        if self.stop_after == round_index + 1:
            return True
        return time.perf_counter() - self.last >= self.cost / CHECKPOINT_SHARE

    def saved(self, seconds: float) -> None:
        """Note a save that took ``seconds`` and ended now."""
        self.cost, self.last = seconds, time.perf_counter()


def round_work(config: RunConfig, round_index: int) -> RoundWork:
    return RoundWork(
        round=round_index,
        train=round_index < config.rounds,  # the last evaluation closes the run
        global_eval=global_eval_due(config, round_index),
        gfl_client=0 if config.setting == "gfl" else None,
    )


def evaluation_row(round_index: int, replies: list[ClientReply]) -> dict[str, Any]:
    """The history row's evaluation part, pooled over the clients' test samples."""
    evals = [r.evaluation for r in replies]
    total = sum(e.total for e in evals)
    row: dict[str, Any] = {
        "round": round_index,
        "acc": sum(e.correct for e in evals) / total,
        "top5": sum(e.correct_top5 for e in evals) / total,
        "test_loss": sum(e.loss_sum for e in evals) / total,
        "client_acc": [round(e.accuracy, 6) for e in evals],
    }
    globals_ = [r.global_acc for r in replies if r.global_acc is not None]
    if globals_:
        row["global_acc"] = float(np.mean(globals_))
    gfl = [r.gfl for r in replies if r.gfl is not None]
    if gfl:
        row["gfl_acc"] = gfl[0].accuracy
        row["gfl_top5"] = gfl[0].correct_top5 / max(gfl[0].total, 1)
    return row


class RoundLoop:
    """Drives a method's server half and a transport's client halves round by round."""

    def __init__(
        self, server: ServerHalf, transport: Transport, config: RunConfig, client_ids: list[int]
    ) -> None:
        self.server, self.transport, self.config = server, transport, config
        self.client_ids = list(client_ids)

    def round(self, round_index: int) -> dict[str, Any]:
        """One round; returns its history row (without the wall time)."""
        work = round_work(self.config, round_index)
        replies = self.transport.client_round(work)
        order = sorted(replies)
        row = evaluation_row(round_index, [replies[i] for i in order])
        if order != self.client_ids:
            row["clients"] = order  # some clients failed: who this row pools
        timings = dict.fromkeys(PHASES, 0.0) | {"model": 0.0}
        for i in order:
            for name, seconds in replies[i].timings.items():
                timings[name] = timings.get(name, 0.0) + seconds
        if work.train:
            uploads = {i: replies[i].upload or {} for i in order}  # client order: same sums
            start = time.perf_counter()
            # The server's draws come from (seed, round), whatever the clients drew.
            seed_everything(derive_seed(self.config.seed, round_index))
            self.server.aggregate(round_index, uploads)
            messages = self.server.configure(round_index + 1, order)
            timings["server"] = time.perf_counter() - start
            row |= {
                "train_loss": float(np.nanmean([replies[i].train_loss for i in order])),
                "bytes_up_per_client": float(
                    np.mean([message_nbytes(u) for u in uploads.values()])
                ),
                "bytes_down_per_client": float(
                    np.mean([message_nbytes(messages.get(i)) for i in order])
                ),
                **self.server.round_metrics(),
            }
            timings["broadcast"] += self.transport.deliver(messages)
        row["timings"] = timings
        return row

    def run(
        self,
        start: int,
        stop: int,
        history: list[dict[str, Any]],
        after_round: Callable[[int, dict[str, Any]], None] | None = None,
        progress: bool = False,
        desc: str = "",
    ) -> list[dict[str, Any]]:
        """Rounds ``start .. stop - 1``, appended to ``history`` as each one ends (so a
        caller that catches an error still holds every finished round)."""
        bar = tqdm(
            total=self.config.rounds + 1,
            initial=start,
            disable=not progress,
            desc=desc,
            unit="round",
        )
        try:
            for t in range(start, stop):
                round_start = time.perf_counter()
                row = self.round(t)
                row["wall"] = time.perf_counter() - round_start
                history.append(row)
                if after_round is not None:
                    after_round(t, row)
                best = max(r["acc"] for r in history)
                bar.set_postfix(acc=f"{row['acc']:.4f}", best=f"{best:.4f}")
                bar.update(1)
        finally:
            bar.close()
        return history

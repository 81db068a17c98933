"""Where a batch's runs execute, and the progress they show.

`run_all` (fedtsp.paper.experiments) finds the runs missing from the store; an executor
runs them and answers, per run, nothing (its record is in the store) or an error:

- `LocalExecutor`: this machine, ``workers`` processes with one thread each (one run at a
  time in this process when ``workers`` is 1);
- `RayExecutor` (fedtsp.paper.ray_executor): one Ray task per run, on a Ray cluster.

Both report to a `BatchProgress`: runs done / running / left, and the estimated finish
from the plan's per-run estimates (`fedtsp reproduce --plan`).
"""

from __future__ import annotations

import multiprocessing
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Protocol

import torch
from tqdm.auto import tqdm

from fedtsp.core import isa
from fedtsp.core.config import ConfigError, RunConfig
from fedtsp.core.errors import one_line
from fedtsp.core.threads import worker_threads


def describe_run(config: RunConfig) -> str:
    """The run as a reader names it: method, data, seed."""
    return f"{config.algorithm} on {config.population or config.dataset}, seed {config.seed}"


@dataclass
class BatchProgress:
    """Runs done / running / left and the estimated finish of a batch.

    ``estimates``: the plan's seconds per run (None where it has none); ``parallel``: the runs
    the executor runs at once, where it knows before they start. The finish assumes the runs
    keep that pace: what is left (the waiting runs' estimates, and the running runs'
    estimates less their time so far) divided by the runs running, or by ``parallel`` (at
    most the runs left) while fewer have started.
    """

    estimates: dict[str, float | None]
    show_bar: bool = True
    parallel: int = 1
    done: int = 0
    failed: int = 0
    running: dict[str, float] = field(default_factory=dict)  # key -> monotonic start
    ended: set[str] = field(default_factory=set)
    _bar: Any = None

    def __post_init__(self) -> None:
        self._bar = tqdm(
            total=len(self.estimates), disable=not self.show_bar, desc="runs", unit="run"
        )

    @property
    def left(self) -> int:
        return len(self.estimates) - self.done - self.failed - len(self.running)

    def started(self, key: str) -> None:
        if key not in self.ended:
            self.running.setdefault(key, time.monotonic())

    def set_running(self, keys: set[str]) -> None:
        """The runs an executor reports running now (others started earlier are kept
        until they finish: a retried run waits between its attempts)."""
        for key in keys:
            self.started(key)

    def finished(self, key: str, label: str, error: str | None = None) -> None:
        seconds = time.monotonic() - self.running.pop(key, time.monotonic())
        self.ended.add(key)
        if error is None:
            self.done += 1
        else:
            self.failed += 1
        outcome = f"FAILED: {error}" if error else f"done in {seconds / 60:.1f} min"
        self.say(f"run {key[:10]} ({label}): {outcome}")
        self._bar.update(1)
        self._bar.set_postfix_str(self.status(), refresh=True)

    def say(self, text: str) -> None:
        """A line above the bar, or on its own when there is no bar (a batch's log)."""
        line = f"[{self.status()}] {text}"
        self._bar.write(line) if self.show_bar else print(line, flush=True)

    def remaining_seconds(self, now: float | None = None) -> float | None:
        """Estimated seconds until every run is done, or None where a run has no estimate."""
        now = time.monotonic() if now is None else now
        waiting = [k for k in self.estimates if k not in self.running and k not in self.ended]
        parts = [self.estimates[k] for k in waiting]
        parts += [
            None if self.estimates[k] is None else max(self.estimates[k] - (now - t0), 0.0)
            for k, t0 in self.running.items()
        ]
        if any(p is None for p in parts):
            return None
        return sum(parts) / max(len(self.running), min(self.parallel, len(parts)), 1)

    def status(self) -> str:
        total = len(self.estimates)
        text = f"{self.done}/{total} done, {len(self.running)} running, {self.left} left"
        if self.failed:
            text += f", {self.failed} failed"
        remaining = self.remaining_seconds()
        if remaining is not None and (self.left or self.running):
            finish = datetime.now().astimezone() + timedelta(seconds=remaining)
            text += f"; finish ~ {finish:%a %H:%M}"
        return text

    def close(self) -> None:
        self._bar.close()


class Executor(Protocol):
    # Whether the runs execute on this machine (its device is checked before they start),
    # the threads each run gets (the plan's estimates are calibrated at that count), and
    # how many runs it runs at once as far as it knows before they start (1: unknown).
    runs_here: bool
    threads_per_run: int
    parallel_runs: int

    def run(
        self, todo: dict[str, RunConfig], source: Any, store: Path, progress: BatchProgress
    ) -> dict[str, str]:
        """Run every config of ``todo`` (key -> config) into ``store``; key -> error of
        each run that failed (the others' records are in the store)."""
        ...


def run_one(config: RunConfig, source: Any, store: str) -> dict[str, Any]:
    """Run (or resume) one run into ``store``; its record."""
    from fedtsp.engine.simulation import run_experiment

    datasets = source.datasets(config)
    return run_experiment(config, dataset=datasets, out=store, resume=True, progress=False)


def _run_in_worker(config: RunConfig, data: str | None, per_class: int, store: str) -> Any:
    from fedtsp.paper.experiments import DataSource

    return run_one(config, DataSource(data, per_class), store)  # data: DataSource.requested


@dataclass
class LocalExecutor:
    """This machine: ``workers`` processes with one intra-op thread each (on a small CPU,
    two single-threaded runs side by side do more than one run with two threads); one run
    at a time in this process when ``workers`` is 1.

    ``threads`` and ``environment`` rerun runs as they were made (`fedtsp verify`): every run
    then goes to a fresh process with that many threads, started with those environment
    variables (None: unset), such as the CPU kernel pins, which act only before torch loads.
    """

    workers: int = 1
    threads: int | None = None
    environment: dict[str, str | None] | None = None
    runs_here = True

    def __post_init__(self) -> None:
        for name in ("workers", "threads"):
            value = getattr(self, name)
            if name == "threads" and value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name}={value!r} is invalid; must be >= 1")

    @property
    def threads_per_run(self) -> int:
        if self.threads is not None:
            return self.threads
        return 1 if self.workers > 1 else torch.get_num_threads()

    @property
    def parallel_runs(self) -> int:
        return self.workers

    def run(
        self, todo: dict[str, RunConfig], source: Any, store: Path, progress: BatchProgress
    ) -> dict[str, str]:
        errors: dict[str, str] = {}
        if self.workers == 1 and self.threads is None:
            for key, config in todo.items():
                progress.started(key)
                error = None
                try:
                    run_one(config, source, str(store))
                except Exception as exc:  # keep going: one bad run must not stop the batch
                    error = errors[key] = one_line(exc)
                progress.finished(key, describe_run(config), error)
            return errors
        threads = self.threads or 1
        changes = {"OMP_NUM_THREADS": str(self.threads)} if self.threads else {}
        with isa.environment(changes | (self.environment or {})):  # the workers start with it
            return self._run_in_pool(todo, source, store, progress, threads)

    def _run_in_pool(
        self,
        todo: dict[str, RunConfig],
        source: Any,
        store: Path,
        progress: BatchProgress,
        threads: int,
    ) -> dict[str, str]:
        errors: dict[str, str] = {}
        ctx = multiprocessing.get_context("spawn")
        queue = list(todo)  # the pool takes runs in submission order
        with ProcessPoolExecutor(
            self.workers, mp_context=ctx, initializer=worker_threads, initargs=(threads,)
        ) as pool:
            futures = {
                pool.submit(
                    _run_in_worker, config, source.requested, source.synthetic_per_class, str(store)
                ): key
                for key, config in todo.items()
            }
            progress.set_running(set(queue[: self.workers]))
            for future in as_completed(futures):
                key = futures[future]
                error = None
                try:
                    future.result()
                except Exception as exc:
                    error = errors[key] = one_line(exc)
                queue.remove(key)
                progress.set_running(set(queue[: self.workers]))  # the next run starts
                progress.finished(key, describe_run(todo[key]), error)
        return errors

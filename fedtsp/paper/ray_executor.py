"""`fedtsp reproduce --executor ray`: each run of the batch is one Ray task.

A task asks for the resources the profile gives its model family (``[P.resources]`` in
profiles.toml: CPU threads and GPUs, fractions allowed), runs the experiment on whichever
node Ray places it, and is retried once (a crashed worker or a raised error) before the
batch reports it with its run key and error; the other runs go on.

The run store stays the one source of truth, written atomically and by key:

- where the workers see the driver's store (one machine, or a shared filesystem), a task
  writes its record there itself, and a retried run resumes from its checkpoint;
- elsewhere a task runs into a temporary folder of its node and returns the record's
  files, which the driver writes (artefacts first, then the record, as `RunStore.save`).

Which of the two holds is tested, not configured: the driver leaves a probe file in the
store for the batch's duration and each task looks for it.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedtsp.core import isa
from fedtsp.core.atomic import atomic_write_bytes
from fedtsp.core.config import RunConfig
from fedtsp.core.errors import UserError, one_line
from fedtsp.core.results import RunStore
from fedtsp.core.threads import worker_threads
from fedtsp.paper.executors import BatchProgress, describe_run, run_one
from fedtsp.paper.profiles import Profile, run_resources

RAY_MISSING = (
    "--executor ray needs Ray, which Flower's simulation installs: pip install -e '.[flower]'"
)
# How often the driver refreshes the runs-running count while it waits for results.
POLL_SECONDS = 10.0


class BatchBoard:
    """A Ray actor the tasks report to: which runs are running (and in which process),
    and how many attempts each run has had."""

    def __init__(self) -> None:
        self.running: dict[str, int] = {}
        self.attempts: dict[str, int] = {}

    def started(self, key: str, pid: int) -> None:
        self.running[key] = pid
        self.attempts[key] = self.attempts.get(key, 0) + 1

    def ended(self, key: str) -> None:
        self.running.pop(key, None)

    def snapshot(self) -> tuple[dict[str, int], dict[str, int]]:
        return dict(self.running), dict(self.attempts)


def run_task(
    config: RunConfig,
    key: str,
    data: str | None,
    per_class: int,
    store: str,
    probe: str,
    threads: int,
    board: Any,
) -> dict[str, Any]:
    """One run on a Ray worker: into the shared store, or into a temporary folder whose
    record files go back to the driver (artefacts first)."""
    from fedtsp.paper.experiments import DataSource

    board.started.remote(key, os.getpid())
    worker_threads(threads)
    shared = (Path(store) / probe).exists()
    out = Path(store) if shared else Path(tempfile.mkdtemp(prefix="fedtsp-run-"))
    try:
        record = run_one(config, DataSource(data, per_class), str(out))
        files: list[tuple[str, bytes]] = []
        if not shared:
            local = RunStore(out)
            for path in (local.artifacts_path(record["key"]), local.record_path(record["key"])):
                if path.exists():
                    files.append((path.name, path.read_bytes()))
        return {"key": record["key"], "files": files}
    finally:
        if not shared:
            shutil.rmtree(out, ignore_errors=True)


def import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise UserError(RAY_MISSING) from None
    return ray


@dataclass
class RayExecutor:
    """Runs the batch as Ray tasks on the cluster at ``address`` (None: Ray's own
    ``RAY_ADDRESS``, else a Ray instance started on this machine for the batch).

    ``profile``: the profile whose ``[P.resources]`` sizes each task. ``retries``: how
    many times a failed task runs again before it is reported (the issue's rule: once).
    """

    profile: Profile
    address: str | None = None
    retries: int = 1
    runs_here = False  # the cluster's nodes have the devices, not necessarily this one
    threads_per_run = 1  # the driver's estimates: one thread per run, as on a CPU node
    parallel_runs = 1  # the cluster's share is known once tasks start (the board counts them)

    def run(
        self, todo: dict[str, RunConfig], source: Any, store: Path, progress: BatchProgress
    ) -> dict[str, str]:
        ray = import_ray()
        started_here = not ray.is_initialized()
        if started_here:
            with warnings.catch_warnings():  # Ray's notice of a future default, not ours
                warnings.simplefilter("ignore", FutureWarning)
                ray.init(address=self.address, include_dashboard=False, log_to_driver=False)
        store = Path(store)
        store.mkdir(parents=True, exist_ok=True)
        probe = store / f".ray-probe-{uuid.uuid4().hex}"
        probe.touch()
        try:
            return self._run(ray, todo, source, store, probe.name, progress)
        finally:
            probe.unlink(missing_ok=True)
            if started_here:
                ray.shutdown()

    def _run(
        self,
        ray: Any,
        todo: dict[str, RunConfig],
        source: Any,
        store: Path,
        probe: str,
        progress: BatchProgress,
    ) -> dict[str, str]:
        board = ray.remote(num_cpus=0)(BatchBoard).remote()
        task = ray.remote(run_task)
        pending: dict[Any, str] = {}
        for key, config in todo.items():
            need = run_resources(self.profile, config)
            ref = task.options(
                num_cpus=need.cpus,
                num_gpus=need.gpus,
                max_retries=self.retries,
                retry_exceptions=True,
                name=f"fedtsp-{key[:10]}",
                # Ray starts its workers on every node with this process's CPU kernels.
                runtime_env={"env_vars": isa.inherited()},
            ).remote(
                config,
                key,
                source.requested,
                source.synthetic_per_class,
                str(store),
                probe,
                need.threads,
                board,
            )
            pending[ref] = key
        errors: dict[str, str] = {}
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1, timeout=POLL_SECONDS)
            running, attempts = ray.get(board.snapshot.remote())
            progress.set_running(set(running))
            for ref in done:
                key = pending.pop(ref)
                error = None
                try:
                    result = ray.get(ref)
                    if result["key"] != key:
                        raise RuntimeError(
                            f"the worker ran it as run {result['key'][:10]}: its data differ "
                            "from the driver's"
                        )
                    for name, data in result["files"]:
                        atomic_write_bytes(store / name, data)
                except Exception as exc:
                    tries = attempts.get(key, 0)
                    error = errors[key] = f"{_task_error(exc)} (attempts: {max(tries, 1)})"
                ray.get(board.ended.remote(key))
                progress.finished(key, describe_run(todo[key]), error)
        return errors


def _task_error(exc: BaseException) -> str:
    """The run's own error inside Ray's wrapper (a task's exception, or a dead worker)."""
    cause = getattr(exc, "cause", None)
    if isinstance(cause, BaseException):
        return one_line(cause)
    return one_line(exc)

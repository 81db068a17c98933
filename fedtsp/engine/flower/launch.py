"""Run a prepared work folder on Flower: the simulation engine, or local processes.

``run_flower`` is what ``fedtsp run --engine flower-sim|flower-processes`` calls. The
process mode starts what a real deployment runs on separate machines: one SuperLink and one
SuperNode per client (each handed its own ``node-<i>.npz``), all on 127.0.0.1, then submits
the app with ``flwr run``. ``scripts/flower_local.sh`` does the same step by step in shell.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

from fedtsp.core.config import FAILURE_POLICIES, ROUND_TIMEOUT, RunConfig
from fedtsp.core.results import RunStore
from fedtsp.engine.build import Datasets, load_datasets
from fedtsp.engine.flower.workdir import (
    ClientFailureError,
    check_flower_options,
    engine_key,
    load_run,
    prepare_workdir,
)
from fedtsp.engine.runspec import check_run

FLOWER_MISSING = (
    "Flower is not installed; install the extra with: pip install 'fedtsp[flower]' "
    "(flwr[simulation] with the Ray backend)"
)


def require_flower() -> None:
    try:
        import flwr  # noqa: F401
    except ImportError:
        raise ImportError(FLOWER_MISSING) from None


def flower_env() -> dict[str, str]:
    """The environment of every Flower process: telemetry off, thread count passed on."""
    env = dict(os.environ)
    env["FLWR_TELEMETRY_ENABLED"] = "0"
    # Flower's processes start further Flower tools by name (the SuperLink runs
    # `flower-superexec`): put this environment's scripts first even when it is not activated.
    scripts = str(Path(sys.executable).parent)
    env["PATH"] = os.pathsep.join([scripts, env.get("PATH", "")])
    # The same intra-op thread count as this process: float reductions then run in the same
    # order on every node, so results equal the in-process simulator's to the last bit.
    env["OMP_NUM_THREADS"] = str(torch.get_num_threads())
    return env


def _outcome(workdir: Path) -> dict[str, Any]:
    """The record the ServerApp wrote; raise its error if the run stopped early."""
    run = load_run(workdir)
    record = RunStore(run["out"]).load(run["key"])
    if record is not None:
        return record
    partial = Path(run["out"]) / "incomplete" / f"{run['key']}.json"
    if partial.exists():
        saved = json.loads(partial.read_text())
        if saved["status"] == "failed":
            raise ClientFailureError(saved["error"])
        if saved["status"] == "complete_with_failures":
            return saved
        if saved["status"] == "interrupted":  # stop_after: as the simulator reports it
            done = len(saved["history"]) - 1
            return {"key": run["key"], "interrupted_after_round": done, "history": saved["history"]}
        raise ClientFailureError(
            f"the Flower run ended after {len(saved['history'])} round(s) without finishing; "
            f"its rounds so far are in {partial}"
        )
    raise ClientFailureError(
        f"the Flower run wrote no record for {run['key']}; see the Flower logs in {workdir}"
    )


# ---- simulation engine ----------------------------------------------------------------
def run_simulation_engine(workdir: str | Path, num_cpus: int = 1) -> dict[str, Any]:
    """Flower's simulation engine (Ray backend): one virtual SuperNode per client."""
    require_flower()
    os.environ["FLWR_TELEMETRY_ENABLED"] = "0"
    from flwr.simulation import run_simulation

    from fedtsp.engine.flower.apps import make_apps

    workdir = Path(workdir).resolve()
    run = load_run(workdir)
    server, client = make_apps(workdir)
    _start_ray(num_cpus)  # Flower's Ray backend reuses a running Ray and shuts it down at the end
    backend_config = {
        # One CPU per virtual client; num_cpus bounds how many run at once (Ray actors).
        "client_resources": {"num_cpus": 1, "num_gpus": 0.0},
        "init_args": {"num_cpus": num_cpus, "include_dashboard": False},
    }
    run_simulation(
        server_app=server,
        client_app=client,
        num_supernodes=run["config"]["num_clients"],
        backend_config=backend_config,
    )
    return _outcome(workdir)


def _start_ray(num_cpus: int, attempts: int = 3) -> None:
    """Start Ray, retrying: its raylet must register within a fixed 30 s, which a busy
    machine can miss; nothing of the run has started yet, so a retry is harmless."""
    import ray

    for attempt in range(1, attempts + 1):
        try:
            ray.init(num_cpus=num_cpus, include_dashboard=False, logging_level="WARNING")
            return
        except Exception as exc:  # noqa: BLE001 - Ray raises a bare Exception here
            ray.shutdown()
            if attempt == attempts:
                raise RuntimeError(f"Ray did not start after {attempts} attempts: {exc}") from exc


# ---- separate processes -------------------------------------------------------------------
def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def write_app(workdir: Path, superlink_port: int) -> tuple[Path, Path]:
    """A minimal Flower App (its components live in the installed fedtsp) and a FLWR_HOME
    whose default SuperLink connection points at 127.0.0.1:<superlink_port>."""
    app = workdir / "app"
    app.mkdir(parents=True, exist_ok=True)
    (app / "pyproject.toml").write_text(
        "[project]\n"
        'name = "fedtsp-flower"\nversion = "0.1.0"\n'
        'description = "fedtsp algorithms on Flower"\nlicense = "MIT"\n'
        "dependencies = []\n\n"
        "[tool.flwr.app]\n"
        'publisher = "fedtsp"\n\n'
        "[tool.flwr.app.components]\n"
        'serverapp = "fedtsp.engine.flower.apps:server_app"\n'
        'clientapp = "fedtsp.engine.flower.apps:client_app"\n\n'
        "[tool.flwr.app.config]\n"
        f"workdir = {json.dumps(str(workdir))}\n"
    )
    home = workdir / "flwr-home"
    home.mkdir(parents=True, exist_ok=True)
    (home / "config.toml").write_text(
        '[superlink]\ndefault = "fedtsp-local"\n\n'
        "[superlink.fedtsp-local]\n"
        f'address = "127.0.0.1:{superlink_port}"\ninsecure = true\n'
    )
    return app, home


def _wait_port(port: int, timeout: float, what: str, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with code {proc.returncode} while starting")
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise RuntimeError(f"{what} did not open port {port} within {timeout:g} s")


class LocalFederation:
    """A SuperLink and one SuperNode per client as separate processes on 127.0.0.1.

    Use as a context manager: every process it started is stopped on exit (each runs in
    its own process group, so a SuperNode's ClientApp subprocesses go with it).
    """

    def __init__(self, workdir: str | Path) -> None:
        require_flower()
        self.workdir = Path(workdir).resolve()
        self.run = load_run(self.workdir)
        self.logs = self.workdir / "logs"
        self.superlink: subprocess.Popen | None = None
        self.supernodes: list[subprocess.Popen] = []
        self.submitter: subprocess.Popen | None = None
        self._files: list[Any] = []

    def _spawn(self, args: list[str], name: str, env: dict[str, str]) -> subprocess.Popen:
        self.logs.mkdir(parents=True, exist_ok=True)
        handle = open(self.logs / f"{name}.log", "wb")  # noqa: SIM115 - closed in close()
        self._files.append(handle)
        return subprocess.Popen(
            args, stdout=handle, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )

    def start(self) -> None:
        env = flower_env()
        port = free_port()
        self.app, home = write_app(self.workdir, port)
        self.env = env | {"FLWR_HOME": str(home)}
        self.superlink = self._spawn(
            [
                _tool("flower-superlink"),
                "--insecure",
                "--disable-runtime-dependency-installation",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
            ],
            "superlink",
            self.env,
        )
        _wait_port(port, 60, "flower-superlink", self.superlink)
        for i in range(self.run["config"]["num_clients"]):
            data = self.workdir / f"node-{i}.npz"
            self.supernodes.append(
                self._spawn(
                    [
                        _tool("flower-supernode"),
                        "--insecure",
                        "--superlink",
                        f"127.0.0.1:{port}",
                        "--host",
                        "127.0.0.1",
                        "--port",
                        str(free_port()),
                        "--node-config",
                        f'partition-id={i} data-file="{data}"',
                    ],
                    f"supernode-{i}",
                    self.env,
                )
            )

    def submit(self) -> None:
        """``flwr run <app>``: the SuperLink starts the ServerApp, which waits for the nodes."""
        self.submitter = self._spawn(
            [_tool("flwr"), "run", str(self.app), "--stream"], "flwr-run", self.env
        )

    def wait(self, timeout: float | None = None) -> dict[str, Any]:
        """Block until the ServerApp has written its record (or its failure); return it."""
        assert self.submitter is not None, "call submit() first"
        deadline = None if timeout is None else time.monotonic() + timeout
        key, out = self.run["key"], Path(self.run["out"])
        partial = out / "incomplete" / f"{key}.json"
        while True:
            if RunStore(out).load(key) is not None:
                return _outcome(self.workdir)
            if partial.exists():
                status = json.loads(partial.read_text()).get("status")
                if status in ("failed", "complete_with_failures", "interrupted"):
                    return _outcome(self.workdir)
            if self.submitter.poll() is not None and self.submitter.returncode != 0:
                raise ClientFailureError(
                    f"flwr run exited with code {self.submitter.returncode}; "
                    f"see {self.logs / 'flwr-run.log'}"
                )
            if self.superlink is not None and self.superlink.poll() is not None:
                raise ClientFailureError(f"the SuperLink died; see {self.logs / 'superlink.log'}")
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"the Flower run did not finish within {timeout:g} s")
            time.sleep(0.5)

    def kill_node(self, index: int) -> int:
        """Kill client ``index``'s SuperNode and its children (as a crash would); its pid."""
        proc = self.supernodes[index]
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        return proc.pid

    def close(self) -> None:
        procs = [self.submitter, *self.supernodes, self.superlink]
        for proc in procs:
            if proc is not None and proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in procs:
            if proc is None:
                continue
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        for handle in self._files:
            handle.close()

    def __enter__(self) -> LocalFederation:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _tool(name: str) -> str:
    # Prefer the console script beside this interpreter (the same environment).
    local = Path(sys.executable).parent / name
    found = str(local) if local.exists() else shutil.which(name)
    if found is None:
        raise FileNotFoundError(f"{name} not found; {FLOWER_MISSING}")
    return found


def run_processes(workdir: str | Path, timeout: float | None = None) -> dict[str, Any]:
    with LocalFederation(workdir) as federation:
        federation.submit()
        return federation.wait(timeout)


# ---- one entry point --------------------------------------------------------------------
def run_flower(
    config: RunConfig,
    *,
    engine: str,
    data: str | Path | None = None,
    dataset: Datasets | None = None,
    out: str | Path = "runs",
    workdir: str | Path | None = None,
    force: bool = False,
    on_failure: str = FAILURE_POLICIES[0],
    round_timeout: float = ROUND_TIMEOUT,
    num_cpus: int = 1,
    resume: bool = False,
    checkpoint_every: int | None = None,
    stop_after: int | None = None,
) -> dict[str, Any]:
    """Run one experiment on Flower and return its run record (from the store if present).

    Checkpoints, ``resume`` and ``stop_after`` work as in
    :func:`fedtsp.engine.simulation.run_experiment`: the server keeps its own state, every node's
    state and the messages not yet delivered, so a resumed run ends identical.
    """
    require_flower()
    check_flower_options(engine, on_failure, round_timeout, checkpoint_every)
    check_run(config)
    datasets = load_datasets(config, data, dataset)
    store = RunStore(out)
    key = engine_key(config, datasets, engine)
    cached = store.load(key)
    if cached is not None and not force:  # before any node file is written
        cached["cache_hit"] = True
        return cached
    if force:
        store.checkpoint_path(key).unlink(missing_ok=True)
    elif not resume:
        store.refuse_unfinished(key)
    for stale in (store.record_path(key), store.incomplete_path(key)):
        stale.unlink(missing_ok=True)
    workdir = Path(workdir) if workdir is not None else Path(out) / "flower-work"
    prepare_workdir(
        config,
        datasets,
        workdir,
        out=out,
        engine=engine,
        on_failure=on_failure,
        round_timeout=round_timeout,
        resume=resume,
        checkpoint_every=checkpoint_every,
        stop_after=stop_after,
        key=key,
    )
    if engine == "flower-sim":
        return run_simulation_engine(workdir, num_cpus=num_cpus)
    return run_processes(workdir)

"""`fedtsp reproduce --executor ray` on a local Ray cluster of 2 CPUs: a worker killed
mid-run leaves no record and the rerun completes with the history of an uninterrupted
run; a run that raises is tried twice, reported with its key and error, and the other
runs finish; the store's records are written by the workers or, where they cannot see
the store, by the driver. (The smoke profile through Ray: tests/test_reproduce.py.)"""

from __future__ import annotations

import os
import signal
import threading
import time

import psutil
import pytest
from conftest import tiny_config

from fedtsp.core.results import RunStore
from fedtsp.engine.simulation import run_key
from fedtsp.paper import ray_executor
from fedtsp.paper.experiments import DataSource, RunsFailed, RunSpec, run_all
from fedtsp.paper.profiles import load_profile
from fedtsp.paper.verify import compare_histories

pytestmark = pytest.mark.slow
SOURCE = DataSource("synthetic", 12)


@pytest.fixture(scope="module")
def profile():
    return load_profile("smoke")


def _spec(**changes) -> RunSpec:
    return RunSpec(tiny_config(algorithm="fedproto", **changes))


def _key(spec: RunSpec) -> str:
    return run_key(spec.config, SOURCE.datasets(spec.config))


def _task_process(key: str) -> psutil.Process | None:
    """The Ray worker running run ``key`` now (its process title names the task)."""
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = proc.info["cmdline"] or []
        if cmdline and cmdline[0] == f"ray::fedtsp-{key[:10]}":
            return proc
    return None


def test_a_killed_worker_leaves_no_record_and_the_rerun_completes(ray_cluster, profile, tmp_path):
    spec = _spec(rounds=24)  # rounds enough that the run is still going when it is killed
    key = _key(spec)
    store = RunStore(tmp_path / "ray")
    outcome: dict[str, BaseException] = {}

    def batch() -> None:
        executor = ray_executor.RayExecutor(profile, retries=0)
        try:
            run_all([spec], SOURCE, store.root, progress=False, executor=executor)
        except BaseException as exc:  # noqa: BLE001 - handed to the test's thread
            outcome["error"] = exc

    thread = threading.Thread(target=batch)
    thread.start()
    deadline = time.monotonic() + 300
    worker = None
    while worker is None:
        assert time.monotonic() < deadline and thread.is_alive(), outcome
        worker = _task_process(key)
    # Step the worker in slices of a few milliseconds (SIGSTOP / SIGCONT) until its first
    # checkpoint, then kill it: polling a free-running worker let the whole run end between
    # two polls on a loaded machine (twice in CI); a stopped worker cannot outrun the test.
    worker.suspend()
    while not store.checkpoint_path(key).exists():
        assert time.monotonic() < deadline, "no checkpoint within 300 s"
        worker.resume()
        time.sleep(0.005)
        worker.suspend()
    os.kill(worker.pid, signal.SIGKILL)
    thread.join(300)
    error = outcome.get("error")
    assert isinstance(error, RunsFailed)
    assert f"\n  {key}: fedproto on cifar10, seed 0: " in str(error)
    assert str(error).startswith("1 of 1 runs failed")
    assert store.load(key) is None
    assert not list(store.root.rglob("*.tmp")) and not list(store.root.glob(".ray-probe-*"))

    # The rerun resumes from the checkpoint and ends where a run never interrupted ends.
    executor = ray_executor.RayExecutor(profile)
    [resumed] = run_all([spec], SOURCE, store.root, progress=False, executor=executor)
    [local] = run_all([spec], SOURCE, tmp_path / "local", progress=False)
    assert len(resumed["history"]) == spec.config.rounds + 1
    assert compare_histories(local["history"], resumed["history"]) == ({}, None)


def test_a_failing_run_is_tried_twice_and_reported_and_the_others_finish(
    ray_cluster, profile, tmp_path
):
    good, bad = _spec(seed=1), _spec(seed=2)
    store = RunStore(tmp_path / "runs")
    damaged = store.checkpoint_path(_key(bad))
    damaged.parent.mkdir(parents=True)
    damaged.write_bytes(b"not a checkpoint")
    executor = ray_executor.RayExecutor(profile)
    with pytest.raises(RunsFailed) as failed:
        run_all([good, bad], SOURCE, store.root, progress=False, executor=executor)
    message = str(failed.value)
    assert message.startswith("1 of 2 runs failed")
    assert f"\n  {_key(bad)}: fedproto on cifar10, seed 2: checkpoint " in message
    assert "is unreadable" in message
    assert "(attempts: 2)" in message
    assert store.load(_key(good)) is not None and store.load(_key(bad)) is None


def test_workers_that_cannot_see_the_store_send_the_records_to_the_driver(
    ray_cluster, profile, tmp_path, monkeypatch
):
    """A task that finds no probe file runs into a folder of its own and returns the
    record's files; the driver writes them, byte for byte what a shared store holds."""
    spec = _spec(seed=3, rounds=2)
    shared = run_all([spec], SOURCE, tmp_path / "shared", progress=False,
                     executor=ray_executor.RayExecutor(profile))  # fmt: skip
    elsewhere = tmp_path / "elsewhere"

    def probe_elsewhere(self, ray, todo, source, store, probe, progress):
        (store / probe).unlink()  # as a worker on another machine sees it: absent
        return original(self, ray, todo, source, store, probe, progress)

    original = ray_executor.RayExecutor._run
    monkeypatch.setattr(ray_executor.RayExecutor, "_run", probe_elsewhere)
    [received] = run_all([spec], SOURCE, elsewhere, progress=False,
                         executor=ray_executor.RayExecutor(profile))  # fmt: skip
    assert compare_histories(shared[0]["history"], received["history"]) == ({}, None)

    def names(root):
        return sorted(p.name for p in root.iterdir() if p.is_file())

    assert names(elsewhere) == names(tmp_path / "shared")
    assert f"{_key(spec)}.json" in names(elsewhere)
    assert not (elsewhere / "checkpoints").exists()  # the task's own folder kept those


def test_resources_come_from_the_profile_and_bad_ones_fail_in_one_line(profile, tmp_path):
    from fedtsp.paper import profiles

    paper = load_profile("paper")
    config = tiny_config()
    assert profiles.run_resources(profile, config) == profiles.Resources(1.0, 0.0)
    gpu = config.replace(device="cuda")
    assert profiles.run_resources(paper, gpu.replace(family="htfe2")) == (2.0, 0.5)
    assert profiles.run_resources(paper, gpu.replace(family="htfe9")) == (4.0, 1.0)  # default
    toml = tmp_path / "profiles.toml"
    text = profiles.PROFILES_FILE.read_text()
    toml.write_text(text + "\n[smoke.resources]\ndefault = { cpus = 2, gpus = 1.5 }\n")
    with pytest.raises(profiles.ConfigError, match=r"resources.default = .* is invalid"):
        profiles.load_profile("smoke", toml)

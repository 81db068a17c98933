"""Client processes (``engine.client_pool``): every method's run equals the in-process
simulator's, checkpoints and resume work across the two, the work is balanced by FLOPs,
and a failing or vanished client process is reported with its clients."""

from __future__ import annotations

import os
import signal

import numpy as np
import pytest
from conftest import history_rows, native_setting, tiny_config

from fedtsp.algorithms import algorithm_names
from fedtsp.algorithms.clients import NonFiniteLossError
from fedtsp.core.config import ConfigError
from fedtsp.engine.client_pool import ClientPool, ClientWorkerError, client_shares, forward_flops
from fedtsp.engine.loop import round_work
from fedtsp.engine.simulation import prepare, run_experiment


@pytest.mark.parametrize("algorithm", algorithm_names())
def test_every_method_runs_in_client_processes_as_in_one_process(tmp_path, tiny_data, algorithm):
    config = tiny_config(algorithm=algorithm, rounds=2, **native_setting(algorithm))
    here = run_experiment(config, dataset=tiny_data, out=tmp_path / "one", progress=False)
    pool = run_experiment(
        config, dataset=tiny_data, out=tmp_path / "two", progress=False, client_workers=2
    )
    # Exact: each client's draws depend on (seed, round, client) only, and both sides
    # run one intra-op thread (conftest; each worker sets its own).
    assert history_rows(pool["history"]) == history_rows(here["history"])
    assert pool["summary"] == here["summary"] and pool.get("server") == here.get("server")
    assert pool["key"] == here["key"]  # where the clients ran is not part of the run
    assert (
        pool["environment"]["client_workers"] == 2 and "client_workers" not in here["environment"]
    )
    # The artifacts read the clients' states, which came back from the workers.
    assert pool.get("artifacts") == here.get("artifacts")
    if "artifacts" in here:
        a = np.load(tmp_path / "one" / here["artifacts"]["file"])
        b = np.load(tmp_path / "two" / pool["artifacts"]["file"])
        assert a.files and all(np.array_equal(a[k], b[k]) for k in a.files)


def test_checkpoints_move_between_client_processes_and_one_process(tmp_path, tiny_data):
    config = tiny_config(algorithm="fedtsp", rounds=3)
    whole = run_experiment(config, dataset=tiny_data, out=tmp_path / "whole", progress=False)
    for first, second in ((2, 1), (1, 3)):
        out = tmp_path / f"cut-{first}-{second}"
        part = run_experiment(
            config, dataset=tiny_data, out=out, progress=False, stop_after=2, client_workers=first
        )
        assert part["interrupted_after_round"] == 1
        resumed = run_experiment(
            config, dataset=tiny_data, out=out, progress=False, resume=True, client_workers=second
        )
        assert history_rows(resumed["history"]) == history_rows(whole["history"])


def test_shares_cover_every_client_once_and_balance_the_flops(tiny_data):
    run = prepare(tiny_config(num_clients=8, alpha=0.3), dataset=tiny_data)
    flops = {c.model.arch: forward_flops(c) for c in run.clients}
    assert len(flops) == 4 and len(set(flops.values())) == 4  # htfe-cpu: four architectures
    assert min(flops.values()) > 1e4  # real counts, not the floor of 1
    shares = client_shares(run.clients, 3, local_epochs=1)
    assert sorted(i for s in shares for i in s) == list(range(8))
    cost = {c.index: flops[c.model.arch] * (3 * c.num_train + len(c.test_y)) for c in run.clients}
    loads = [sum(cost[i] for i in s) for s in shares]
    # Longest first onto the least loaded: no share exceeds another by more than one client.
    assert max(loads) - min(loads) <= max(cost.values())
    assert sorted(client_shares(run.clients, 20, local_epochs=1)) == [[i] for i in range(8)]


def test_an_error_in_a_client_process_comes_back_as_itself(tmp_path, tiny_data):
    config = tiny_config(algorithm="local", rounds=2, lr=1e30)  # the loss overflows at once
    with pytest.raises(NonFiniteLossError, match=r"in round 0") as caught:
        run_experiment(config, dataset=tiny_data, out=tmp_path, progress=False, client_workers=2)
    assert any("in the process of clients" in note for note in caught.value.__notes__)


def test_a_vanished_client_process_is_named_with_its_clients(tiny_data):
    run = prepare(tiny_config(algorithm="fedproto"), dataset=tiny_data)
    pool = ClientPool(run.transport, 2)
    procs = []
    try:
        replies = pool.client_round(round_work(run.config, 0))
        assert sorted(replies) == [0, 1, 2, 3]
        procs = list(pool._procs)
        os.kill(pool._procs[1].pid, signal.SIGKILL)
        pool._procs[1].join(timeout=10)
        with pytest.raises(ClientWorkerError, match=r"clients \[\d, \d\] ended \(exit code -9\)"):
            pool.client_round(round_work(run.config, 1))
    finally:
        pool.close()
    assert len(procs) == 2 and not any(p.is_alive() for p in procs)


@pytest.mark.parametrize("workers", [0, -1, 1.5, True])
def test_bad_worker_counts_fail_before_any_work(tmp_path, tiny_data, workers):
    with pytest.raises(ConfigError, match="client_workers"):
        run_experiment(
            tiny_config(), dataset=tiny_data, out=tmp_path, progress=False, client_workers=workers
        )
    assert not any(tmp_path.iterdir())  # nothing was written

"""The Flower adapter: same per-round results as the in-process simulator, on Flower's
simulation engine (Ray) and as separate SuperLink/SuperNode processes on 127.0.0.1, and a
killed client process reported with its node and round, without losing recorded rounds."""

from __future__ import annotations

import json
import os
import time

import pytest
from conftest import history_rows, tiny_config

pytest.importorskip("flwr", reason="the flower extra (flwr[simulation]) is not installed")
os.environ["FLWR_TELEMETRY_ENABLED"] = "0"
# Ray warns that its handling of visible accelerators will change; these tests use none.
os.environ["RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO"] = "0"

from fedtsp.core.config import ConfigError  # noqa: E402
from fedtsp.engine.flower import ClientFailureError, LocalFederation, prepare_workdir, run_flower  # noqa: E402
from fedtsp.engine.simulation import run_experiment  # noqa: E402


@pytest.mark.parametrize("algorithm", ["fedproto", "fedtsp"])
def test_flower_simulation_equals_in_process_simulator(tmp_path, tiny_data, algorithm):
    config = tiny_config(algorithm=algorithm, rounds=2)
    sim = run_experiment(config, dataset=tiny_data, out=tmp_path / "sim", progress=False)
    flower = run_flower(config, engine="flower-sim", dataset=tiny_data, out=tmp_path / "fl")
    # Exact: the same seeds per round and per client, uploads aggregated in client order,
    # one intra-op thread in both (the Ray actor runs with OMP_NUM_THREADS=1).
    assert history_rows(flower["history"]) == history_rows(sim["history"])
    assert flower["history"][-1]["acc"] > flower["history"][0]["acc"] + 0.1  # it learnt
    assert flower["engine"] == "flower-sim" and flower["status"] == "complete"
    assert flower["key"] != sim["key"]  # the engine is part of the record's provenance
    assert len(flower["nodes"]) == 4 and flower["summary"]["best_acc"] == sim["summary"]["best_acc"]
    again = run_flower(config, engine="flower-sim", dataset=tiny_data, out=tmp_path / "fl")
    assert again["cache_hit"] is True and again["history"] == flower["history"]


# One method of each kind, in the settings where the kind's Flower path differs.
KINDS = {
    "head-sharing": ("fedgh", "htfl"),
    "shared-model": ("fedkd", "htfl"),  # its client half once read server state
    "generator": ("fedgen", "htfl"),
    "homogeneous, global model": ("fedavg", "gfl"),
    "homogeneous, fine-tuned": ("fedavg-ft", "pfl"),
    "clustered": ("cfl", "pfl"),  # splits after round 1: each cluster gets its own model
}
SPLIT_AT_ONCE = {"stall_ratio": 1.0, "warmup_rounds": 1, "min_cluster_size": 1}


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_every_kind_of_method_runs_on_flower_as_in_the_simulator(tmp_path, tiny_data, kind):
    algorithm, setting = KINDS[kind]
    family = "homo-cpu" if setting != "htfl" else tiny_config().family
    options = SPLIT_AT_ONCE if algorithm == "cfl" else {}
    config = tiny_config(
        algorithm=algorithm, setting=setting, family=family, rounds=2, algo_options=options
    )
    sim = run_experiment(config, dataset=tiny_data, out=tmp_path / "sim", progress=False)
    flower = run_flower(config, engine="flower-sim", dataset=tiny_data, out=tmp_path / "fl")
    assert history_rows(flower["history"]) == history_rows(sim["history"])
    assert flower["summary"] == sim["summary"]  # gfl / pfl summaries included
    if setting == "gfl":
        assert all(0 < row["gfl_acc"] <= 1 for row in flower["history"])
    if algorithm == "cfl":
        assert flower["history"][1]["num_clusters"] == 2 and flower["server"] == sim["server"]


def test_a_population_runs_on_flower_as_in_the_simulator(tmp_path):
    from conftest import synthetic_dataset

    datasets = {
        "cifar10": synthetic_dataset(per_class=12),
        "fmnist": synthetic_dataset("fmnist", per_class=12),
    }
    config = tiny_config(
        algorithm="clusters",
        algo_options={"clusters": "truth"},  # the oracle: the server reads the planted groups
        population="mixed-domain",
        fraction=1.0,
        setting="pfl",
        family="homo-fedavgcnn_s",
        rounds=2,
    )
    sim = run_experiment(config, dataset=datasets, out=tmp_path / "sim", progress=False)
    flower = run_flower(config, engine="flower-sim", dataset=datasets, out=tmp_path / "fl")
    assert history_rows(flower["history"]) == history_rows(sim["history"])
    assert flower["server"]["assignment"] == [0, 1, 0, 1] == flower["partition"]["groups"]


def test_bad_engine_input_fails_before_any_work(tmp_path, tiny_data):
    with pytest.raises(ConfigError, match="engine='ray'"):
        prepare_workdir(tiny_config(), tiny_data, tmp_path, out=tmp_path, engine="ray")
    with pytest.raises(ConfigError, match="on_failure='retry'"):
        prepare_workdir(
            tiny_config(),
            tiny_data,
            tmp_path,
            out=tmp_path,
            engine="flower-sim",
            on_failure="retry",
        )
    assert not list(tmp_path.glob("node-*.npz"))


def test_work_folder_hands_each_node_only_its_partition(tmp_path, tiny_data):
    import numpy as np

    run = prepare_workdir(
        tiny_config(num_clients=3), tiny_data, tmp_path, out=tmp_path, engine="flower-processes"
    )
    sizes = [int(np.load(tmp_path / f"node-{i}.npz")["train_y"].shape[0]) for i in range(3)]
    tests = [int(np.load(tmp_path / f"node-{i}.npz")["test_y"].shape[0]) for i in range(3)]
    assert sum(sizes) + sum(tests) == len(tiny_data.train_labels) + len(tiny_data.test_labels)
    assert sorted(run["partition"]["sizes"]) == sorted(
        a + b for a, b in zip(sizes, tests, strict=True)
    )
    server = np.load(tmp_path / "server.npz")
    assert set(server.files) == {"setup_rng"}  # nothing of any client: facts come in set-up


@pytest.mark.parametrize(
    ("algorithm", "client_init"),
    [("lg-fedavg", "independent"), ("fedproto", "shared"), ("fedkd", "independent")],
)
def test_every_node_sets_up_where_the_simulator_does(tmp_path, tiny_data, algorithm, client_init):
    import torch

    from fedtsp.engine.driver import set_up_server
    from fedtsp.engine.flower.workdir import NodeRuntime, server_run
    from fedtsp.engine.simulation import build

    config = tiny_config(algorithm=algorithm, num_clients=8, client_init=client_init)
    run = prepare_workdir(config, tiny_data, tmp_path, out=tmp_path, engine="flower-sim")
    sim_run, sim, _ = build(config, {config.dataset: tiny_data}, run["key"])
    sim_replies = sim.set_up(sim_run.rng)  # the simulator's set-up, before any message
    replies = {}
    for client in sim.clients:
        node = NodeRuntime.build(run, client.index, tmp_path / f"node-{client.index}.npz", None)
        mine = node.client.model.state_dict()
        assert all(torch.equal(v, mine[k]) for k, v in client.model.state_dict().items())
        assert node.setup_reply.facts == sim_replies[client.index].facts
        for name, value in vars(client.state).items():  # e.g. FedKD's W_h: one draw each
            if isinstance(value, torch.nn.Module):
                theirs = getattr(node.client.state, name).state_dict()
                assert all(torch.equal(v, theirs[k]) for k, v in value.state_dict().items())
        replies[client.index] = node.setup_reply
    _, server = server_run(tmp_path)
    first = set_up_server(server.server, replies, server.rng)  # the nodes' facts and uploads
    sim_first = set_up_server(sim_run.server, sim_replies, sim_run.rng)
    assert (first is None) == (sim_first is None) == (algorithm != "lg-fedavg")
    if first is not None:  # LG-FedAvg: client 0's head, sent by node 0 in set-up
        assert first.keys() == sim_first.keys()
        assert all(torch.equal(v, sim_first[k]) for k, v in first.items())


@pytest.mark.slow
def test_three_supernode_processes_equal_the_simulator(tmp_path, tiny_data):
    config = tiny_config(algorithm="fedproto", rounds=1, num_clients=3)
    sim = run_experiment(config, dataset=tiny_data, out=tmp_path / "sim", progress=False)
    record = run_flower(config, engine="flower-processes", dataset=tiny_data, out=tmp_path / "fl")
    assert history_rows(record["history"]) == history_rows(sim["history"])
    assert record["engine"] == "flower-processes" and len(set(record["nodes"].values())) == 3
    stored = json.loads((tmp_path / "fl" / f"{record['key']}.json").read_text())
    assert stored["status"] == "complete" and stored["history"] == record["history"]
    # The Flower processes inherit the AVX2 pins: the ServerApp's record says so.
    assert stored["environment"]["isa"]["tag"] == "avx2 (pinned)"


@pytest.mark.slow
def test_killed_supernode_is_reported_and_recorded_rounds_are_kept(tmp_path, tiny_data):
    config = tiny_config(algorithm="fedproto", rounds=3, num_clients=3)
    sim = run_experiment(config, dataset=tiny_data, out=tmp_path / "sim", progress=False)
    work, out = tmp_path / "work", tmp_path / "fl"
    run = prepare_workdir(
        config, tiny_data, work, out=out, engine="flower-processes", round_timeout=60
    )
    partial = out / "incomplete" / f"{run['key']}.json"
    with LocalFederation(work) as federation:
        federation.submit()
        deadline = time.monotonic() + 240
        while not (partial.exists() and json.loads(partial.read_text())["history"]):
            assert time.monotonic() < deadline, "round 0 never finished"
            assert federation.submitter.poll() is None, "the run ended before round 0 finished"
            time.sleep(0.2)
        federation.kill_node(1)  # client 1's SuperNode dies while round 1 runs
        with pytest.raises(
            ClientFailureError, match=r"client 1 \(Flower node \d+\) failed in round 1"
        ):
            federation.wait(timeout=240)
    saved = json.loads(partial.read_text())
    assert saved["status"] == "failed" and saved["failures"][0]["client"] == 1
    assert history_rows(saved["history"]) == history_rows(
        sim["history"][:1]
    )  # round 0 is kept, exact
    assert not (out / f"{run['key']}.json").exists()  # never served as a finished run


def test_an_interrupted_flower_run_resumes_to_the_simulators_history(tmp_path, tiny_data):
    # FedGen: server state (its generator), client state and a message pending at the cut.
    config = tiny_config(algorithm="fedgen", rounds=3)
    sim = run_experiment(config, dataset=tiny_data, out=tmp_path / "sim", progress=False)
    kwargs = {"engine": "flower-sim", "dataset": tiny_data, "out": tmp_path / "fl"}
    cut = run_flower(config, stop_after=2, **kwargs)
    assert cut["interrupted_after_round"] == 1 and len(cut["history"]) == 2
    with pytest.raises(FileExistsError, match="--resume"):
        run_flower(config, **kwargs)  # refused before any work; the checkpoint survives
    resumed = run_flower(config, resume=True, **kwargs)
    assert resumed["status"] == "complete"
    assert history_rows(resumed["history"]) == history_rows(sim["history"])
    assert not list((tmp_path / "fl" / "checkpoints").glob("*.pt"))  # done: removed

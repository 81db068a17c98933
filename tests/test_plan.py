"""`fedtsp reproduce --plan`: every run listed, stored or new, and the new ones' cost."""

from __future__ import annotations

import dataclasses
import json

import pytest

from fedtsp.cli import main
from fedtsp.core.config import ConfigError
from fedtsp.core.results import RunStore
from fedtsp.engine.build import partition_dataset
from fedtsp.paper import plan
from fedtsp.paper.experiments import DataSource, run_all
from fedtsp.paper.notebook_runs import notebook_plan
from fedtsp.paper.profiles import load_profile, notebook_parameters
from fedtsp.paper.reproduce import NOTEBOOKS_DIR, find_notebooks


@pytest.fixture(scope="module")
def smoke():
    return load_profile("smoke"), find_notebooks(NOTEBOOKS_DIR, ["03"])


def test_new_runs_are_estimated_from_their_images_and_the_calibration(smoke, tmp_path):
    profile, notebooks = smoke
    runs, speeds = plan.make_plan(profile, notebooks, tmp_path, workers=1, measured_from=[])
    assert len(runs) > 4 and not any(r.stored for r in runs)
    assert {r.source for r in runs} == {"calibration"}
    assert len({r.key for r in runs}) == len(runs)
    run = runs[0]
    c = run.config
    _, _, partition = partition_dataset(c, DataSource("synthetic").get(c.dataset))
    trained = sum(len(ix) for ix in partition.client_train) * c.rounds * c.local_epochs
    assert sum(t for t, _ in run.images.values()) == trained
    tested = sum(len(ix) for ix in partition.client_test) * (c.rounds + 1)
    assert sum(e for _, e in run.images.values()) >= tested  # plus global evaluations
    assert set(run.images) <= set(speeds)
    expected = sum(t / speeds[a][0] + e / speeds[a][1] for a, (t, e) in run.images.items())
    assert run.seconds == pytest.approx(expected)
    assert all(t > 0 and e > 0 for t, e in speeds.values())


def _timed_record(key: str, config, train: float, wall: float, slow_round: float = 0.0) -> dict:
    """A stored record whose every round trains `train` s in a round of `wall` s, except
    one round slowed by `slow_round` s (another job on the machine)."""
    history = [{"round": 0, "acc": 0.1}]
    for r in range(1, config.rounds + 1):
        extra = slow_round if r == 1 else 0.0
        history.append(
            {"round": r, "acc": 0.1, "wall": wall + extra, "timings": {"train": train + extra}}
        )
    return {"key": key, "config": config.to_dict(), "history": history}


def test_a_run_with_a_measured_twin_is_estimated_from_its_rounds(smoke, tmp_path, capsys):
    profile, notebooks = smoke
    runs, _ = plan.make_plan(profile, notebooks, tmp_path, workers=1, measured_from=[])
    target = runs[0].config
    # Twins: another seed and partition (5 rounds, one slowed by another job), and another
    # schedule (3 rounds x 2 epochs): their rounds give 2 s of training per epoch and 1 s
    # for the rest of a round.
    twin = target.replace(seed=target.seed + 7, partition_seed=target.partition_seed + 7, rounds=5)
    longer = twin.replace(rounds=3, local_epochs=2, global_eval_every=3)
    other = target.replace(lr=target.lr * 2)  # another config: must not count
    store = RunStore(tmp_path / "measured")
    store.save(_timed_record("k0", twin, train=2.0 * twin.local_epochs,
                             wall=2.0 * twin.local_epochs + 1.0, slow_round=500.0))  # fmt: skip
    store.save(_timed_record("k1", longer, train=4.0, wall=5.0))
    store.save(_timed_record("k2", other, train=40.0, wall=90.0))
    runs, _ = plan.make_plan(
        profile, notebooks, tmp_path, workers=1, measured_from=[store.root, tmp_path / "absent"]
    )
    twins = [r for r in runs if r.source == "twin"]
    expected = target.rounds * (target.local_epochs * 2.0 + 1.0)
    assert runs[0] in twins and all(r.seconds == pytest.approx(expected) for r in twins)
    assert any(r.source == "calibration" for r in runs)
    assert sorted(len(v) for v in plan.measured_costs([store.root]).values()) == [1, 2]
    assert plan.round_cost({"config": target.to_dict(), "history": [{"round": 0}]}) is None


def test_stored_runs_are_listed_and_not_estimated(smoke, tmp_path, monkeypatch, capsys):
    profile, notebooks = smoke
    first = plan.make_plan(profile, notebooks, tmp_path, workers=1)[0][0].key
    original = RunStore.load
    monkeypatch.setattr(
        RunStore, "load", lambda self, key: {} if key == first else original(self, key)
    )
    runs, _ = plan.make_plan(profile, notebooks, tmp_path, workers=1)
    assert [r.stored for r in runs].count(True) == 1 and runs[0].seconds is None
    plan.print_plan(profile, notebooks, tmp_path, workers=1)
    out = capsys.readouterr().out
    assert f"{len(runs)} runs: 1 in the store, {len(runs) - 1} to run" in out
    assert f"{first}  stored" in out  # the whole key, as `fedtsp verify --key` takes it
    assert "Estimated wall time of the new runs:" in out
    assert f"0 of {len(runs) - 1} estimated from the measured rounds" in out
    assert " >=" in out  # a calibrated estimate is marked as a lower bound


def test_an_absent_device_gives_image_counts_instead(smoke, tmp_path, monkeypatch, capsys):
    profile, notebooks = smoke
    monkeypatch.setattr(plan, "device_available", lambda device: False)
    gpu = dataclasses.replace(profile, base={**profile.base, "device": "cuda"})
    plan.print_plan(gpu, notebooks, tmp_path, workers=1)
    out = capsys.readouterr().out
    assert "No estimate: device 'cuda' is not available here" in out
    assert "training:" in out and "inference:" in out


def test_a_gpu_profile_is_planned_on_a_cpu_machine_but_its_new_runs_stop_before_any_work(
    smoke, tmp_path, monkeypatch
):
    profile, notebooks = smoke
    gpu = dataclasses.replace(profile, base={**profile.base, "device": "cuda"})
    source = DataSource(gpu.data, gpu.synthetic_per_class)
    specs = notebook_plan(
        "03_main_table", notebook_parameters(gpu, "03_main_table", tmp_path), source
    )
    assert specs and all(s.config.device == "cuda" for s in specs)
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    with pytest.raises(ConfigError, match="device='cuda' is invalid; CUDA is not available"):
        run_all(specs, source, tmp_path / "runs", progress=False)
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_cli_plan_runs_nothing(tmp_path, capsys):
    assert (
        main(
            [
                "reproduce",
                "--profile",
                "smoke",
                "--only",
                "03",
                "--plan",
                "--results",
                str(tmp_path),
            ]
        )
        == 0
    )
    assert "to run" in capsys.readouterr().out
    assert not (tmp_path / "smoke" / "runs").exists() or not any(
        (tmp_path / "smoke" / "runs").glob("*.json")
    )


def test_makespan_puts_the_longest_runs_first_and_shares_a_device_by_its_fraction():
    assert plan.makespan([(10.0, 1.0)] * 3, devices=2) == 20.0
    assert plan.makespan([(10.0, 0.5)] * 4, devices=1) == 20.0  # two at a time on one
    assert plan.makespan([(10.0, 0.5)] * 4, devices=2) == 10.0
    # 30 s on one device; the three halves share the other: 10 + 10
    assert plan.makespan([(10.0, 0.5), (30.0, 1.0), (10.0, 0.5), (10.0, 0.5)], 2) == 30.0
    assert plan.makespan([], devices=4) == 0.0


def test_devices_size_a_gpu_profile_from_the_committed_gpu_check(tmp_path, monkeypatch, capsys):
    paper = load_profile("paper")
    notebooks = find_notebooks(NOTEBOOKS_DIR, ["02"])
    monkeypatch.setattr(plan, "device_available", lambda device: device == "cpu")
    monkeypatch.setattr(plan, "GPU_CHECK", tmp_path / "gpu_check.json")  # none yet
    argv = ["reproduce", "--profile", "paper", "--only", "02", "--plan", "--results"]
    assert main([*argv, str(tmp_path), "--devices", "8"]) == 0
    out = capsys.readouterr().out
    assert "No GPU calibration for" in out and "families htfe9)" in out
    assert "python benchmarks/gpu_check.py" in out

    # A GPU check that measured 1000 training and 5000 inference images/s everywhere.
    runs, _ = plan.make_plan(paper, notebooks, tmp_path, workers=1)
    archs = {arch for run in runs for arch in run.images}
    speeds = {"train_images_per_s": 1000.0, "infer_images_per_s": 5000.0}
    gpu = {"device": "Test GPU", "architectures": {a: {"fp32": speeds} for a in archs}}
    (tmp_path / "gpu_check.json").write_text(json.dumps(gpu))
    assert main([*argv, str(tmp_path), "--devices", "8"]) == 0
    out = capsys.readouterr().out
    seconds = [sum(t / 1000 + e / 5000 for t, e in r.images.values()) for r in runs]
    wall = plan.makespan([(s, 1.0) for s in seconds], 8)  # HtFE9: a whole GPU per run
    assert wall < sum(seconds) / 7  # 24 runs spread over 8 GPUs
    assert f"Estimated wall time of the new runs: {plan._hours(wall)} on 8 GPUs" in out
    assert f"({sum(seconds) / 3600:.1f} GPU-hours;" in out


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--profile", "smoke", "--plan", "--devices", "2"], "--devices counts GPUs"),
        (["--profile", "paper", "--devices", "2"], "--devices sizes a cluster with --plan"),
        (["--profile", "smoke", "--ray-address", "x:1"], "--ray-address is an option of"),
        (["--profile", "smoke", "--executor", "ray", "--workers", "2"], "--workers is an option"),
    ],
)
def test_bad_cluster_options_fail_in_one_line(argv, message, capsys):
    assert main(["reproduce", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_progress_estimates_the_finish_from_the_plans_estimates(capsys):
    """What is left (waiting runs' estimates, running runs' estimates less their time so
    far) over the runs running now; unknown as soon as one run has no estimate."""
    from fedtsp.paper.executors import BatchProgress

    progress = BatchProgress({"a": 100.0, "b": 100.0, "c": 50.0, "d": 40.0}, show_bar=False)
    progress.finished("d", "run d")
    progress.running.update({"a": 1000.0 - 30.0, "b": 1000.0 - 10.0})
    assert progress.remaining_seconds(now=1000.0) == (50.0 + 70.0 + 90.0) / 2
    assert progress.status().startswith("1/4 done, 2 running, 1 left; finish ~ ")
    progress.finished("a", "run a", error="boom")
    assert progress.status().startswith("1/4 done, 1 running, 1 left, 1 failed")
    assert "FAILED: boom" in capsys.readouterr().out
    # Before any run starts, the executor's workers set the pace (at most one per run left).
    two = BatchProgress({"a": 100.0, "b": 100.0, "c": 50.0}, show_bar=False, parallel=2)
    assert two.remaining_seconds() == 250.0 / 2
    two.finished("a", "run a"), two.finished("b", "run b")
    assert two.remaining_seconds() == 50.0
    unknown = BatchProgress({"a": 10.0, "b": None}, show_bar=False)
    assert unknown.remaining_seconds() is None and "finish" not in unknown.status()

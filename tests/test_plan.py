"""`fedtsp reproduce --plan`: every run listed, stored or new, and the new ones' cost."""

from __future__ import annotations

import dataclasses

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


def test_a_run_with_a_measured_twin_is_estimated_by_its_wall_time(smoke, tmp_path, capsys):
    profile, notebooks = smoke
    runs, _ = plan.make_plan(profile, notebooks, tmp_path, workers=1, measured_from=[])
    target = runs[0].config
    other_seed = target.replace(seed=target.seed + 7, partition_seed=target.partition_seed + 7)
    store = RunStore(tmp_path / "measured")
    for i, (config, wall) in enumerate([(other_seed, 30.0), (other_seed, 50.0), (target, 90.0)]):
        # Two twins (medians: 40 s); the third record is another run's and must not count.
        changed = config if i < 2 else config.replace(rounds=config.rounds + 1)
        record = {"key": f"k{i}", "config": changed.to_dict(), "timings": {"wall": wall}}
        store.save(record)
    runs, _ = plan.make_plan(
        profile, notebooks, tmp_path, workers=2, measured_from=[store.root, tmp_path / "absent"]
    )
    twins = [r for r in runs if r.source == "twin"]
    assert runs[0] in twins and all(r.seconds == pytest.approx(40.0) for r in twins)
    assert any(r.source == "calibration" for r in runs)
    assert sorted(len(v) for v in plan.measured_walls([store.root]).values()) == [1, 2]


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
    assert f"{first[:10]}  stored" in out
    assert "Estimated wall time of the new runs:" in out
    assert f"0 of {len(runs) - 1} estimated from the measured wall time" in out
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

"""Committed benchmark outputs: the README shows them verbatim, and each says where it ran."""

from __future__ import annotations

import json

import pytest
from conftest import REPO, load_script

RESULTS = REPO / "benchmarks" / "results"


readme = load_script("readme")

# The README's performance figures: each block is a committed benchmark output.
EXPECTED_BLOCKS = {
    "speed_vs_htfllib",
    "bench_models",
    "bench_round",
    "bench_server",
    "bench_workers",
    "bench_isa",
    "kernel_pins",
    "reproduce_times",
    "fast_path_accuracy",
    "fast_path_accuracy_fixed_partition",
    "code_metrics_change",
    "plan_costs",
    "reproduce_cpu_same_runs",
    "cli_latency",
    "cpu_wall",
    "evidence_wall",
}


def test_every_readme_block_equals_its_committed_output():
    text = "".join(page.read_text() for page in readme.pages())
    found = readme.blocks(text)
    assert set(found) >= EXPECTED_BLOCKS
    for name, body in found.items():
        assert body == (RESULTS / f"{name}.md").read_text(), f"README block {name} is stale"


@pytest.mark.parametrize("name", sorted(EXPECTED_BLOCKS - {"code_metrics_change"}))
def test_benchmark_outputs_name_command_code_and_machine(name):
    data = json.loads((RESULTS / f"{name}.json").read_text())
    assert data["command"].startswith("python benchmarks/")
    assert len(data["code"]["git_commit"]) == 40
    assert data["code"]["git_dirty"] is False  # measured on committed code
    for fact in ("cpu", "cores", "threads", "torch", "device", "cpu_capability"):
        assert data["machine"][fact] not in (None, "")
    md = (RESULTS / f"{name}.md").read_text()
    assert md.startswith(f"Measured at code {data['code']['git_commit'][:7]} on ")


def test_the_readme_headline_is_the_committed_claims_and_table_1():
    text = (REPO / "README.md").read_text()
    found = readme.blocks(text, "results")
    # The verdicts the README leads with are the pre-registered evidence's.
    assert {
        "evidence/claims_bottom_line",
        "evidence/claims_summary",
        "evidence/tables/table1_accuracy",
    } <= set(found)
    for name, body in found.items():
        assert body == (REPO / "results" / f"{name}.md").read_text(), f"README block {name}"
    assert "| Local |" in found["evidence/tables/table1_accuracy"]
    assert found["evidence/claims_summary"].count("\n| ") >= 19  # one row per registered claim
    assert found["evidence/claims_bottom_line"].startswith("At the `evidence` profile's scale")


def test_sync_rewrites_a_stale_block_and_refuses_a_missing_file(tmp_path):
    (tmp_path / "t.md").write_text("| a |\n")
    text = "x\n<!-- benchmark:t -->\nold\n<!-- /benchmark:t -->\ny\n"
    assert (
        readme.synced(text, tmp_path)
        == "x\n<!-- benchmark:t -->\n| a |\n<!-- /benchmark:t -->\ny\n"
    )
    with pytest.raises(SystemExit, match="no u.md"):
        readme.synced("<!-- benchmark:u -->\n<!-- /benchmark:u -->", tmp_path)
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "c.md").write_text("| v |\n")
    text = "<!-- results:cpu/c -->\nold\n<!-- /results:cpu/c -->\n"
    assert readme.synced(text, tmp_path, tmp_path) == text.replace("old\n", "| v |\n")


def test_speed_table_reports_speed_ups_and_a_skipped_fast_path():
    speed = load_script("audits/speed_vs_htfllib")
    # Overheads 1 %, 2 %, 4 %: the median share, 2 %, is what the table shows.
    runs = [
        {"s_per_round": 20.0, "phases": {"model": 19.5 - share, "server": 0.5}}
        for share in (0.2, 0.4, 0.8)
    ]
    result = {
        "modes": ["exact"],
        "htfllib": "e959261",
        "setting": {"repeats": 3, "fraction": 0.2, "rounds": 2},
        "probe": {"resnet18": {"fp32": 280.0, "bf16": 30.0}},
        "methods": {
            "FedProto": {"htfllib": {"median": 60.0}, "exact": {"median": 20.0, "runs": runs}}
        },
    }
    lines = speed.table(result).splitlines()
    assert lines[2] == "| FedProto | 60.00 | 20.00 | 3.00x | 2.00 % |"
    assert "resnet18 280 -> 30" in lines[-1]
    assert speed.bf16_pays({"a": {"fp32": 100.0, "bf16": 250.0}})
    assert not speed.bf16_pays(
        {"a": {"fp32": 100.0, "bf16": 250.0}, "b": {"fp32": 100, "bf16": 10}}
    )


def test_fast_path_verdict_compares_the_paired_difference_with_seed_noise():
    fast = load_script("audits/fast_path_accuracy")
    exact = [50.0, 52.0, 54.0]  # seed noise: sample std 2.0
    kept = fast.paired(exact, [51.0, 52.0, 56.0])  # differences 1, 0, 2
    assert kept["mean_difference"] == pytest.approx(1.0)
    assert kept["seed_noise"] == pytest.approx(2.0)
    half = 4.302653 / 3**0.5  # t(0.975, 2 df) x std 1 / sqrt(3)
    assert kept["ci95"] == pytest.approx([1.0 - half, 1.0 + half], abs=1e-5)
    assert kept["verdict"] == "within seed noise"
    lost = fast.paired(exact, [47.0, 49.5, 50.5])  # differences -3, -2.5, -3.5
    assert lost["mean_difference"] == pytest.approx(-3.0)
    assert lost["verdict"] == "outside seed noise"


def test_empty_store_table_states_the_ratio_against_the_target_and_differing_tables():
    empty = load_script("reproduce_empty_store")
    result = {
        "profile": "cpu",
        "code": {"git_commit": "abcdef1" + "0" * 33},
        "before": {"code": "4e74747", "seconds": 6000.0, "runs_seconds": 5000.0, "runs": 84},
        "after": {"seconds": 4200.0, "runs_seconds": 3900.0},
        "plan": {"new": 112, "workers": 2, "runs_seconds": 3000.0},
        "same_tables": {"tables": 14, "differ": ["table1.csv"]},
    }
    result["before"]["note"] = "a note"
    lines = empty.table(result).splitlines()
    assert lines[4] == "| before | 4e74747 | 1 h 40 min (6,000 s) | 1 h 23 min (5,000 s) | 84 |"
    assert lines[5] == "| now | abcdef1 | 1 h 10 min (4,200 s) | 1 h 05 min (3,900 s) | 112 |"
    assert "Now / before: 0.70 (target <= 0.60: not met)" in lines[7]
    assert "13 of 14 (differ: table1.csv)" in lines[7]
    assert empty._clock(59.6) == "60 s"


def test_plan_costs_add_up_the_plan_of_every_notebook():
    plan_costs = load_script("plan_costs")
    plan = plan_costs.plan_cost("smoke")
    assert plan["runs"] > 10 and 0 <= plan["from_twins"] <= plan["runs"]
    assert plan["seconds"] > 0
    assert plan["seconds"] == pytest.approx(sum(plan["per_notebook_seconds"].values()))
    assert set(plan["per_notebook_seconds"]) <= {p.stem for p in (REPO / "notebooks").glob("0*")}
    row = plan_costs.table([plan]).splitlines()[2]
    assert row.startswith(f"| `smoke` | cpu, {plan['workers']} | 0 | {plan['runs']} |")


def test_reproduce_times_show_each_profile_and_the_empty_store_baseline():
    times = load_script("reproduce_times")
    notebooks = {"01_descriptions": 30.0, "02_prototype_semantics": 50.0}
    result = {
        "profiles": {
            "smoke": {"store": "empty", "runs": 61, "seconds": 200.0, "runs_seconds": 120.0}
            | {"notebooks": notebooks},
            "cpu": {"store": "committed", "runs": 146, "seconds": 170.0, "runs_seconds": 3.0}
            | {"notebooks": {"03_main_table": 167.0}, "same_tables": {"tables": 9, "differ": []}},
        },
        "empty_store_baseline": {"what": "one run", "profile": "cpu", "code": "4e74747"}
        | {"seconds": 6226.4, "runs_seconds": 5324.8, "runs": 84},
    }
    lines = times.table(result).splitlines()
    assert lines[2] == "| `smoke` | empty | 61 run | 200 s | 120 s | 80 s |"
    assert lines[3] == "| `cpu` | committed | 146 reused | 170 s | 3 s | 167 s |"
    assert lines[4] == (
        "| `cpu` | empty (code 4e74747, measured once) | 84 federated run "
        "| 1 h 43 min (6,226 s) | 1 h 28 min (5,325 s) | 902 s |"
    )
    assert "equal the committed ones: 9 of 9." in lines[6]


def test_same_runs_pair_a_seeded_sample_and_judge_the_ratio_by_its_interval():
    same = load_script("audits/reproduce_same_runs")
    configs = [{"algorithm": f"a{i}"} for i in range(10)]
    picked = same.sample(configs, 4, seed=0)
    assert len(picked) == 4 and picked == same.sample(configs, 4, seed=0)
    assert picked == sorted(picked, key=configs.index)  # store order kept
    assert same.sample(configs, 0, seed=0) == configs
    then, now = [100.0, 200.0, 300.0], [50.0, 100.0, 150.0]  # every pair at one half
    assert same.ratio_interval(then, now) == pytest.approx([0.5, 0.5])
    low, high = same.ratio_interval([100.0, 100.0, 100.0, 100.0], [40.0, 50.0, 80.0, 90.0])
    assert 0.4 <= low < 0.65 < high <= 0.9
    assert same.verdict([0.45, 0.58]) == "met"
    assert same.verdict([0.65, 0.75]) == "not met"
    assert same.verdict([0.55, 0.66]) == "not separated from the target"
    summary = {"pairs": 3, "then_seconds": 600.0, "now_seconds": 300.0, "then_median": 200.0}
    summary |= {"now_median": 100.0, "ratio": 0.5, "ratio_ci95": [0.5, 0.5], "verdict": "met"}
    result = {"then": "4e74747", "run_set": 84, "sample_seed": 0, "summary": summary}
    lines = same.table(result | {"code": {"git_commit": "abcdef1" + "0" * 33}}).splitlines()
    assert lines[0].startswith("3 of the 84 federated runs of the cpu store at 4e74747")
    assert lines[4] == "| then (4e74747) | 3 | 600 s | 200 s |"
    assert lines[5] == "| now (abcdef1) | 3 | 300 s | 100 s |"
    assert lines[7].startswith("Now / then: 0.50 [95 % CI 0.50, 0.50] (target <= 0.60: met;")


def test_same_runs_rebuilt_from_a_log_must_match_the_sample_pair_by_pair():
    same = load_script("audits/reproduce_same_runs")
    picked = [
        {"algorithm": "fedproto", "dataset": "cifar10", "family": "htfe-cpu", "seed": 0}
        | {"algo_options": {}},
        {"algorithm": "fedtsp", "dataset": "cifar100", "family": "htfe-cpu", "seed": 1}
        | {"algo_options": {"server_epochs": 1}},
    ]
    log = "noise\n1/2 fedproto cifar10 then 89 s, now 72 s\n2/2 fedtsp cifar100 then 264 s, now 261 s\n"
    pairs = same.pairs_from_log(log, picked)
    assert [(p["then"], p["now"]) for p in pairs] == [(89.0, 72.0), (264.0, 261.0)]
    assert pairs[1]["algo_options"] == {"server_epochs": 1} and pairs[1]["seed"] == 1
    with pytest.raises(SystemExit, match="not the sample's"):
        same.pairs_from_log(log, picked[::-1])
    with pytest.raises(SystemExit, match="the log has 1 pairs, the sample 2"):
        same.pairs_from_log(log.splitlines()[1], picked)


def test_the_product_benchmark_measures_a_training_step():
    bench = load_script("bench")
    fast = bench.train_speed("fedavgcnn_s", batch=8, steps=2, channels_last=None, device="cpu")
    plain = bench.train_speed(
        "fedavgcnn_s", batch=8, steps=2, channels_last=None, device="cpu", point_convs=False
    )
    # Images per second, both ways of running 1x1 convolutions: a small CNN's CPU step on 8
    # images takes milliseconds, neither nothing (no step timed) nor seconds.
    assert all(50 < speed < 1e5 for speed in (fast, plain))


def test_the_readme_is_a_map_whose_links_resolve():
    """The README stays within 200 lines, and every relative link of it and of the docs
    pages names a file that exists (and, for a page's #anchor, a heading of that page)."""
    import re

    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) <= 200
    for page in readme.pages():
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
            if target.startswith(("http://", "https://")):
                continue
            path, _, anchor = target.partition("#")
            file = (page.parent / path).resolve() if path else page
            assert file.exists(), (page.name, target)
            if anchor and file.suffix == ".md":
                headings = re.findall(r"^#+ (.*)$", file.read_text(), re.M)
                slugs = {re.sub(r"[^a-z0-9 -]", "", h.lower()).replace(" ", "-") for h in headings}
                assert anchor in slugs, (page.name, target)


def test_a_batchs_wall_time_is_each_invocations_life_less_its_pauses():
    wall = load_script("batch_wall")
    log = "\n".join(
        [
            "start 2026-12-05T10:00:00Z records=2 pid=1 note: at 4715453",
            "beat 2026-12-05T10:30:00Z records=3",
            "pause 2026-12-05T10:40:00Z",
            "beat 2026-12-05T10:50:00Z records=3",
            "resume 2026-12-05T11:00:00Z",
            "beat 2026-12-05T12:00:00Z records=9",
            "shared 2026-12-05T12:10:00Z",  # a CI run beside it until the end
            "end 2026-12-05T12:30:00Z records=9",
            "start 2026-12-05T13:00:00Z records=9 pid=2",
            "pause 2026-12-05T13:30:00Z",
            "beat 2026-12-05T13:45:00Z records=9",  # killed while paused
        ]
    )
    found = wall.invocations(log)
    assert [inv["active"] / 60 for inv in found] == [130, 30]
    assert [inv["shared"] / 60 for inv in found] == [20, 0]
    assert found[0]["note"] == "at 4715453" and found[1]["note"] == ""
    # A second batch's invocation overlapping the last one by 15 minutes is reported.
    other = wall.invocations("start 2026-12-05T13:30:00Z records=0 pid=7\nend 2026-12-05T14:00:00Z")
    assert wall.overlap_seconds(found + other) == 15 * 60
    assert wall.overlap_seconds(found) == 0
    # A record counts for the invocation alive when it was written (a minute's grace: the
    # heartbeat beats once a minute).
    written = [{"created": f"2026-12-05T{t}+0000"} for t in ("10:20:00", "12:31:00", "12:45:00")]
    assert [wall._covers(found[0], r) for r in written] == [True, True, False]
    # The estimate it is set against: the analysis plan's, where the profile has one, else
    # `--plan`'s for an empty store at the one commit the start lines name.
    from fedtsp.paper.profiles import load_profile

    assert wall.batch_commit(found) == "4715453"
    with pytest.raises(SystemExit, match="name 2 commits"):
        wall.batch_commit(found + wall.invocations("start 2026-12-06T10:00:00Z note: f77c40b"))
    seconds, by = wall.estimate_seconds(load_profile("evidence"), "f77c40b")
    assert 10 * 3600 < seconds < 20 * 3600 and by == "the analysis plan's estimate"
    seconds, by = wall.estimate_seconds(load_profile("cpu"), "f77c40b")
    assert 2 * 3600 < seconds < 6 * 3600 and "--plan` for an empty store at f77c40b" in by


def test_the_gpu_check_measures_every_part_and_its_output_feeds_the_plan(tmp_path, monkeypatch):
    """At a toy size on the CPU (the script's own check): every architecture's speeds and
    FLOPs, a round per method whose model TFLOP/s is its training work over its seconds,
    and an output `fedtsp reproduce --plan` reads as the GPU calibration."""
    from fedtsp.paper import plan

    gpu_check = load_script("gpu_check")
    out = tmp_path / "gpu_check.json"
    assert gpu_check.main(["--device", "cpu", "--quick", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert {"command", "code", "machine"} <= set(result)
    assert set(result["architectures"]) == {"fedavgcnn_s", "cnn3_s", "resnet4", "resnet10_s"}
    for row in result["architectures"].values():
        assert row["train_gflop_per_image"] > 0.001
        for precision in ("fp32", "bf16"):
            assert row[precision]["train_images_per_s"] > 10
            assert row[precision]["infer_images_per_s"] > 10
    assert set(result["rounds"]) == {"FedTSP-MiniLM", "FedProto"}
    for r in result["rounds"].values():
        assert r["train_images"] > 100 and 0 < r["train_seconds"] <= r["round_seconds"]
        assert 0 < r["model_tflops"] < 1  # 4 small CNNs on 2 cores
    assert all(v > 0 for v in result["matmul_tflops"].values())
    md = out.with_suffix(".md").read_text()
    assert "| FedProto |" in md and "not measured (no --htfllib checkout given)" in md
    calibration = plan.gpu_calibration(out)
    assert calibration["speeds"]["fp32"]["resnet4"] == (
        result["architectures"]["resnet4"]["fp32"]["train_images_per_s"],
        result["architectures"]["resnet4"]["fp32"]["infer_images_per_s"],
    )
    # Without CUDA the default run writes nothing and says so.
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    assert gpu_check.main(["--out", str(tmp_path / "none.json")]) == 0
    assert not (tmp_path / "none.json").exists()

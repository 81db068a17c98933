"""`fedtsp verify`: a stored run reruns to the same history; an edited record is caught."""

from __future__ import annotations

import json
import math

import pytest
import torch

from fedtsp.cli import main
from fedtsp.core.config import ConfigError
from fedtsp.core.results import RunStore, code_version, short_commit
from fedtsp.paper import verify
from fedtsp.paper.experiments import DataSource, run_all
from fedtsp.paper.notebook_runs import notebook_plan
from fedtsp.paper.profiles import load_profile, notebook_parameters


@pytest.fixture(scope="module")
def smoke_store(tmp_path_factory):
    """The smoke profile's Table 1 runs of FedProto on cifar10, in a results root of their own."""
    root = tmp_path_factory.mktemp("verify") / "results"
    profile = load_profile("smoke")
    params = notebook_parameters(profile, "03_main_table", root)
    source = DataSource(profile.data, profile.synthetic_per_class)
    specs = [
        s
        for s in notebook_plan("03_main_table", params, source)
        if s.labels["method"] == "FedProto"
        and s.labels["dataset"] == "cifar10"
        and s.labels["family"] == params["base"]["family"]
    ]
    records = run_all(specs, source, root / "smoke" / "runs", progress=False)
    return root, [r["key"] for r in records]


def test_a_table_cell_reruns_to_an_identical_history(smoke_store, capsys):
    root, keys = smoke_store
    assert RunStore(root / "smoke" / "runs").load(keys[0])["environment"]["threads"] == 1
    torch.set_num_threads(2)  # this process's count must not leak into the one-thread rerun
    try:
        status = main(["verify", "--profile", "smoke", "table1", "FedProto", "cifar10",
                       "--results", str(root), "--report", str(root / "verify.md")])  # fmt: skip
    finally:
        torch.set_num_threads(1)
    out = capsys.readouterr().out
    assert status == 0, out
    assert f"{keys[0]} FedProto" in out and "identical history (3 evaluations)" in out
    assert "checkable on any x86-64 machine with AVX2; this machine can" in out  # pinned
    report = (root / "verify.md").read_text()
    assert "1 of 1 reruns identical to their records; 1 of them checkable on any x86-64" in report
    assert f"Today's code: {short_commit(code_version())};" in report  # the code that reran


def test_an_edited_record_is_reported_with_its_difference(smoke_store, capsys):
    root, keys = smoke_store
    path = root / "smoke" / "runs" / f"{keys[0]}.json"
    original = path.read_text()
    record = json.loads(original)
    record["history"][1]["acc"] += 0.125
    path.write_text(json.dumps(record))
    try:
        # The key's first 10 characters (a unique prefix stands for the key).
        argv = ["verify", "--profile", "smoke", "--key", keys[0][:10], "--results", str(root)]
        status = main(argv)
    finally:
        path.write_text(original)
    out = capsys.readouterr().out
    assert status == 1
    assert "differs from round 1; largest differences: acc 0.125" in out
    assert "0 of 1 reruns identical" in out and keys[0] in out


def test_a_key_prefix_names_its_one_stored_run(tmp_path):
    store = RunStore(tmp_path)
    for key in ("abcdef0123456789", "abcdef0199999999", "ffff000011112222"):
        (tmp_path / f"{key}.json").write_text("{}")
    assert verify._full_key(store, "ffff0000") == "ffff000011112222"
    assert verify._full_key(store, "abcdef0123") == "abcdef0123456789"
    assert verify._full_key(store, "fff") == "fff"  # too short to stand for a key
    assert verify._full_key(store, "0123456789") == "0123456789"  # none: reported later
    with pytest.raises(ConfigError, match="abcdef01 starts 2 stored runs"):
        verify._full_key(store, "abcdef01")


def test_compare_histories_names_each_metric_and_the_first_round():
    a = [{"round": 0, "acc": 0.1, "client_acc": [0.1, 0.2], "timings": {"x": 1}, "wall": 3.0}]
    a += [{"round": 1, "acc": 0.2, "client_acc": [0.3, 0.4], "loss": math.nan}]
    b = [{"round": 0, "acc": 0.1, "client_acc": [0.1, 0.2], "timings": {"x": 9}, "wall": 1.0}]
    b += [{"round": 1, "acc": 0.25, "client_acc": [0.3, 0.1], "loss": math.nan}]
    differences, first = verify.compare_histories(a, b)
    assert first == 1
    assert differences == pytest.approx({"acc": 0.05, "client_acc": 0.3})
    assert verify.compare_histories(a, a) == ({}, None)
    shorter, first = verify.compare_histories(a, a[:1])
    assert shorter == {"rounds": math.inf} and first == 1


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["verify", "--profile", "smoke"], "name the runs to verify"),
        (["verify", "--profile", "smoke", "table9"], "unknown table 'table9'"),
        (["verify", "--profile", "smoke", "--sample", "0"], "--sample 0 is invalid"),
        (["verify", "--profile", "smoke", "--key", "nokey"], "run nokey is not in the store"),
    ],
)
def test_bad_requests_fail_in_one_line_before_any_rerun(smoke_store, capsys, argv, message):
    root, _ = smoke_store
    assert main([*argv, "--results", str(root)]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1

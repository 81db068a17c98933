"""The refactor safety net: it covers every registered algorithm in each of its settings, and
it names exactly the runs and history rows that differ; its golden pinned histories rerun bit
for bit on whatever machine runs the suite."""

from __future__ import annotations

import importlib.util
import json

import pytest
from conftest import CIFAR10_ARCHIVE, REPO, SHARED_DATA

from fedtsp.algorithms import ALGORITHMS
from fedtsp.core import isa

_spec = importlib.util.spec_from_file_location(
    "regression_set", REPO / "tools" / "regression_set.py"
)
rs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(rs)


def test_every_algorithm_runs_in_every_setting_it_is_defined_for_with_two_seeds():
    labels = [label for label, _, _ in rs.federated_runs()]
    for name, method in ALGORITHMS.items():
        for setting in method.settings:
            assert f"{name}/{setting}/seed0" in labels and f"{name}/{setting}/seed1" in labels
    resumed = [label for label, _, again in rs.federated_runs() if again]
    assert sorted(resumed) == sorted(f"{n}/htfl/seed0/resumed" for n in rs.RESUMED)


def test_the_committed_set_holds_every_run_of_the_list():
    recorded = json.loads((REPO / "tools" / "regression_set.json").read_text())["runs"]
    labels = {label for label, _, _ in rs.federated_runs()}
    assert labels <= set(recorded)
    assert {label.split("/")[0] for label in recorded if label.startswith("fmcl:")} == {
        f"fmcl:{m}" for m in rs.FMCL_METHODS
    }


def test_differences_name_the_run_and_the_rows_that_changed():
    row = {"round": 0, "acc": 0.5}
    expected = {"a": {"history": [row, row], "summary": {}}, "b": {"history": [row], "summary": {}}}
    actual = {
        "a": {"history": [row, {"round": 1, "acc": 0.51}], "summary": {}},
        "c": {"history": [row], "summary": {}},
    }
    assert rs.differences(expected, actual) == [
        "b: recorded but not run",
        "a: differs (history rows [1])",
        "c: not in the recorded set",
    ]
    assert rs.differences(expected, {"a": expected["a"]}, partial=True) == []


def test_a_summary_field_added_later_is_not_a_difference_but_a_changed_one_is():
    row = {"round": 0, "acc": 0.5}
    expected = {"a": {"history": [row], "summary": {"best_acc": 0.5}}}
    newer = {"a": {"history": [row], "summary": {"best_acc": 0.5, "converged": False}}}
    assert rs.differences(expected, newer) == []
    changed = {"a": {"history": [row], "summary": {"best_acc": 0.6, "converged": False}}}
    assert rs.differences(expected, changed) == [
        "a: differs (history rows equal; summary or length)"
    ]


def test_the_golden_runs_cover_each_method_kind_and_were_recorded_pinned():
    recorded = json.loads((REPO / "tools" / "regression_set.json").read_text())
    assert set(rs.GOLDEN) <= set(recorded["runs"])
    assert {"fedtsp", "fedtgp", "alignfed", "fmcl:fmcl", "fmcl:pacfl"} == {
        label.split("/")[0] for label in rs.GOLDEN
    }
    assert recorded["isa"]["pinned"] and recorded["isa"]["effective"]["aten"] == "AVX2"
    assert recorded["versions"]["torch"] and recorded["cpu"]["model"]


@pytest.mark.skipif(not CIFAR10_ARCHIVE.exists(), reason="needs ../shared/data (CIFAR-10/100)")
def test_the_golden_pinned_histories_rerun_bit_for_bit_on_this_machine(monkeypatch, capsys):
    # Recorded on one machine (its CPU in the file), checked on every machine the suite runs
    # on: an AVX2-only CPU, an AVX-512 one, either vendor. A failure here means the pins do
    # not give the same bits on this machine (or the code changed the numbers).
    monkeypatch.setenv("FEDTSP_DATA", str(SHARED_DATA))
    recorded = json.loads((REPO / "tools" / "regression_set.json").read_text())
    assert isa.state().pinned
    found = rs.differences(recorded["runs"], rs.regression_set(list(rs.GOLDEN)), partial=True)
    assert found == [], f"{found}; {rs.unlike(recorded)}; recorded on {recorded['cpu']}"
    assert "fedtsp/htfl/seed0/resumed" in capsys.readouterr().out  # its resume ran too

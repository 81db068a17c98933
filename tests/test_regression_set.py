"""The refactor safety net: it covers every registered algorithm in each of its settings, and
it names exactly the runs and history rows that differ (nothing is run here)."""

from __future__ import annotations

import importlib.util
import json

from conftest import REPO

from fedtsp.algorithms import ALGORITHMS

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

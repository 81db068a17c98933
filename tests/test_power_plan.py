"""Seeds from power, and a budget spent on claim parts in priority order."""

from __future__ import annotations

import pytest

from fedtsp.paper.claims.power import PlannedPart, allocate, seeds_needed
from fedtsp.paper.statistics import equivalence_power, paired_power


def test_seeds_needed_reach_the_power_and_one_fewer_does_not():
    n = seeds_needed("above", sd=1.5, effect=1.71, margin=1.0, parts=2)
    assert paired_power(1.71, 1.5, n, 0.025) >= 0.8 > paired_power(1.71, 1.5, n - 1, 0.025)
    m = seeds_needed("equivalent", sd=0.6, effect=0.0, margin=1.0)
    assert equivalence_power(1.0, 0.6, m, 0.05) >= 0.8 > equivalence_power(1.0, 0.6, m - 1, 0.05)
    # more parts in the claim, a stricter level, more seeds
    assert seeds_needed("above", 1.5, 1.71, 1.0, parts=4) > n
    assert seeds_needed("above", sd=10.0, effect=0.1, margin=1.0) is None
    with pytest.raises(ValueError, match="kind='within'"):
        seeds_needed("within", 1.0, 1.0, 1.0)


def _part(claim: str, seeds: int | None, groups: tuple[str, ...], priority: int) -> PlannedPart:
    return PlannedPart(claim, "s", "c", "above", 1.0, 1.0, 1.0, seeds, groups, priority)


def test_allocate_shares_runs_between_parts_and_follows_priority():
    seconds = {"ours": 10.0, "a": 10.0, "b": 20.0}
    parts = [
        _part("F11", 6, ("ours", "b"), 2),  # needs 2 more seeds of ours, 6 of b: 20 + 120
        _part("F3", 4, ("ours", "a"), 1),  # first: 4 x 10 + 4 x 10 = 80
        _part("F4", 30, ("ours", "a"), 3),  # too many for what is left
        _part("F5", None, ("ours",), 0),  # no seed count reaches the power
    ]
    planned, seeds = allocate(parts, seconds, budget_seconds=250.0)
    status = {p.claim: p.status for p in planned}
    assert status == {
        "F5": "not testable at this budget",
        "F3": "planned",
        "F11": "planned",
        "F4": "not testable at this budget",
    }
    assert seeds == {"ours": 6, "a": 4, "b": 6}  # 60 + 40 + 120 = 220 <= 250


def test_allocate_spends_the_starting_seeds_first():
    planned, seeds = allocate(
        [_part("F3", 3, ("x",), 1)], {"x": 10.0}, budget_seconds=40.0, start={"x": 3}
    )
    assert planned[0].status == "planned" and seeds == {"x": 3}
    planned, _ = allocate([_part("F3", 5, ("x",), 1)], {"x": 10.0}, 40.0, start={"x": 3})
    assert planned[0].status == "not testable at this budget"  # 30 spent, 20 more needed


def test_allocate_charges_nothing_for_seeds_an_earlier_plan_runs():
    # 4 of x's 12 seeds are the plan's: 8 more x 10 s + 12 of y x 10 s = 200 s fits 200.
    parts = [_part("F17", 12, ("x", "y"), 1)]
    planned, seeds = allocate(parts, {"x": 10.0, "y": 10.0}, 200.0, paid={"x": 4})
    assert planned[0].status == "planned" and seeds == {"x": 12, "y": 12}
    planned, _ = allocate(parts, {"x": 10.0, "y": 10.0}, 200.0)
    assert planned[0].status == "not testable at this budget"  # 240 s without them

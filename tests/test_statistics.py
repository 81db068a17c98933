"""The statistics every table, figure and verdict uses: sample std, t-intervals, pairing."""

from __future__ import annotations

import math

import matplotlib
import pandas as pd
import pytest

from fedtsp.paper.plots import grouped_bars
from fedtsp.paper.statistics import (
    paired_difference,
    std_interval,
    summarize,
    summary_frame,
)

matplotlib.use("Agg")


def test_summary_uses_the_sample_std_and_a_student_t_interval():
    s = summarize([1.0, 2.0, 3.0, 4.0])
    assert (s.mean, s.n) == (2.5, 4)
    assert s.std == pytest.approx(1.290994, abs=1e-6)  # ddof = 1; ddof = 0 would be 1.118
    half = 3.182446 * 1.290994 / 2  # t(0.975, 3 df) x std / sqrt(4)
    assert (s.ci_low, s.ci_high) == pytest.approx((2.5 - half, 2.5 + half), abs=1e-5)
    assert s.cell() == "2.50 ± 1.29"
    assert s.interval() == f"[{2.5 - half:+.2f}, {2.5 + half:+.2f}]"


def test_one_value_has_no_spread_and_nans_are_dropped():
    one = summarize([5.0, float("nan"), None])
    assert one.n == 1 and one.mean == 5.0
    assert math.isnan(one.std) and math.isnan(one.ci_low)
    assert one.cell() == "5.00 (n = 1)" and one.interval() == "-"
    assert summarize([]).cell() == "-"
    assert summarize([3.0, 3.0, 3.0]).cell(1) == "3.0 (n = 3, all equal)"


def test_paired_difference_pairs_by_seed_and_drops_unpaired_seeds():
    base = {0: 70.0, 1: 72.0, 2: 71.0}
    other = {0: 71.0, 1: 72.5, 2: 72.0, 3: 99.0}  # seed 3 has no partner
    diff, seeds = paired_difference(base, other)
    assert seeds == [0, 1, 2]
    assert diff.mean == pytest.approx(2.5 / 3)  # differences 1, 0.5, 1
    assert diff.std == pytest.approx(0.288675, abs=1e-6)
    # Unpaired, the seeds' own spread (std 1.0 for base) would hide a gain this size.
    assert diff.ci_low > 0


def test_summary_frame_keeps_group_order_and_numeric_columns():
    frame = pd.DataFrame({"m": ["b", "a", "b", "a"], "v": [1.0, 10.0, 3.0, 14.0]})
    out = summary_frame(frame, ["m"], "v")
    assert list(out["m"]) == ["b", "a"]
    assert list(out.columns) == ["m", "mean", "std", "n", "ci_low", "ci_high"]
    assert out.loc[1, "mean"] == 12.0 and out.loc[1, "std"] == pytest.approx(8**0.5)


def test_bars_draw_the_spread_the_tables_print():
    frame = pd.DataFrame({"method": ["A", "A", "A", "B"], "acc": [80.0, 82.0, 84.0, 90.0]})
    assert std_interval([80.0, 82.0, 84.0]) == pytest.approx((80.0, 84.0))
    fig = grouped_bars(frame, x="method", y="acc")
    # One line per bar (cap, stem, cap joined by NaN gaps): its finite y-range is the bar.
    spans = [[y for y in line.get_ydata() if not math.isnan(y)] for line in fig.axes[0].lines]
    assert (min(spans[0]), max(spans[0])) == pytest.approx((80.0, 84.0))  # A: 82 ± 2
    assert spans[1] == []  # B has one seed: no bar at all


def test_paired_power_matches_the_normal_approximation_for_many_seeds():
    from fedtsp.paper.statistics import paired_power

    # effect = 1 sd, 40 seeds: z-approximation power = Phi(sqrt(40) - 1.96) ~ 0.9999
    assert paired_power(1.0, 1.0, 40) > 0.999
    # effect = 0.5 sd, 34 seeds: the noncentral t's 0.8078 (G*Power's paired t-test, two
    # tails; the normal approximation would need only 32 seeds for 80 %)
    assert paired_power(0.5, 1.0, 34) == pytest.approx(0.8078, abs=1e-4)
    assert paired_power(0.0, 1.0, 10) == pytest.approx(0.05, abs=1e-9)  # the test's size
    assert paired_power(1.0, 1.0, 1) == 0.0


def test_seeds_for_power_finds_the_smallest_n():
    from fedtsp.paper.statistics import equivalence_power, paired_power, seeds_for_power

    n = seeds_for_power(lambda k: paired_power(0.5, 1.0, k))
    assert n == 34 and paired_power(0.5, 1.0, n - 1) < 0.8  # the textbook n for d = 0.5
    assert seeds_for_power(lambda k: paired_power(0.01, 1.0, k), most=20) is None
    # equivalence needs more seeds than a difference of the same size
    m = seeds_for_power(lambda k: equivalence_power(0.5, 1.0, k))
    assert m > n and equivalence_power(0.5, 1.0, m) >= 0.8

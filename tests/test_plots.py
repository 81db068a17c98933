"""Figures a reader can read: bars from zero, labels that never pile up, legends off the data."""

from __future__ import annotations

import matplotlib
import numpy as np
import pandas as pd
import pytest

from fedtsp.paper.plots import accuracy_curves, grouped_bars, paired_scatter, privacy_tradeoff

matplotlib.use("Agg")


def test_bars_start_at_zero_wrap_long_names_and_fold_a_single_hue_into_the_title():
    names = ["(1) local only", "(5) LLM descriptions + trainable prompts (FedTSP)"]
    frame = pd.DataFrame(
        {"row": names * 2, "acc": [25.0, 27.0, 25.2, 27.4], "encoder": ["minilm"] * 4}
    )
    ax = grouped_bars(frame, x="row", y="acc", hue="encoder", title="Table 2").axes[0]
    assert ax.get_ylim()[0] == 0.0
    labels = [t.get_text() for t in ax.get_xticklabels()]
    assert labels[0] == "(1) local only"
    assert all(len(line) <= 16 for line in labels[1].split("\n")) and "\n" in labels[1]
    assert ax.get_legend() is None and ax.get_title() == "Table 2 (encoder: minilm)"


def test_a_legend_of_several_hues_sits_outside_the_axes():
    frame = pd.DataFrame({"d": ["x", "x", "y", "y"], "acc": [1.0, 2, 3, 4], "h": list("abab")})
    fig = grouped_bars(frame, x="d", y="acc", hue="h")
    fig.canvas.draw()
    legend = fig.axes[0].get_legend().get_window_extent()
    assert legend.x0 >= fig.axes[0].get_window_extent().x1


METHODS = [f"M{i}" for i in range(11)] + ["FedTSP-MiniLM"]


def _curves(methods: list[str]) -> pd.DataFrame:
    """Two panels of six rounds, two seeds per method, each method on its own level."""
    return pd.DataFrame(
        [
            {"panel": p, "method": m, "seed": s, "round": r, "acc": i + r + s}
            for p in ("a", "b")
            for i, m in enumerate(methods)
            for s in (0, 1)
            for r in range(6)
        ]
    )


def test_curves_have_whole_rounds_twelve_distinguishable_lines_and_one_legend():
    methods = METHODS
    curves = _curves(methods)
    fig = accuracy_curves(curves, panel="panel", line="method")
    assert len(fig.legends) == 1 and all(ax.get_legend() is None for ax in fig.axes)
    lines = {h.get_label(): h for h in fig.legends[0].legend_handles}
    styles = {(tuple(lines[m].get_color()), lines[m].get_linestyle()) for m in methods}
    assert len(styles) == 12  # no two methods share both colour and dash pattern
    colours = [np.array(lines[m].get_color()[:3]) for m in methods]
    gaps = [np.linalg.norm(a - b) for i, a in enumerate(colours) for b in colours[i + 1 :]]
    assert min(gaps) > 0.2  # nor two colours that look alike (RGB distance), up to 12
    ours = lines["FedTSP-MiniLM"]
    assert tuple(ours.get_color())[:3] == (0.0, 0.0, 0.0)  # FedTSP in black, drawn thicker
    assert ours.get_linewidth() > max(lines[m].get_linewidth() for m in methods[:-1])
    ticks = fig.axes[0].get_xticks()
    assert all(float(t).is_integer() for t in ticks)


def test_scatter_points_carry_seed_error_bars_and_a_legend_off_the_data():
    frame = pd.DataFrame(
        {
            "method": ["A", "B", "C", "FedTSP-MiniLM"] * 2,
            "top1": [24.6, 24.6, 25.0, 26.0, 24.8, 24.4, 25.0, 26.4],
            "top5": [58.90, 58.85, 59.9, 60.0, 59.1, 58.65, 59.9, 60.4],
        }
    )
    fig = paired_scatter(frame, "top1", "top5", "method", "top-1", "top-5")
    fig.canvas.draw()
    ax = fig.axes[0]
    legend = ax.get_legend()
    names = [t.get_text() for t in legend.get_texts()]
    assert names == ["FedTSP-MiniLM", "C", "A", "B"]  # in the points' vertical order
    assert legend.get_window_extent().x0 >= ax.get_window_extent().x1  # off the data
    colours = {tuple(c.lines[0].get_color()) for c in ax.containers}
    assert len(colours) == 4  # one colour each
    # A's top-5 over its two seeds: 58.90 and 59.10, so its bar spans mean -/+ sd.
    caps = [c for c in ax.containers if c.get_label() == "A"][0]
    low, high = sorted(caps.lines[2][1].get_segments()[0][:, 1])  # the y bar
    assert (low, high) == pytest.approx((59.0 - 0.1414, 59.0 + 0.1414), abs=1e-3)


def test_bar_names_get_room_enough_not_to_overlap():
    names = [f"FedMethod-{i:02d}" for i in range(12)]
    frame = pd.DataFrame({"m": names, "acc": range(12), "block": ["GFL"] * 5 + ["PFL"] * 7})
    fig = grouped_bars(frame, x="m", y="acc", hue="block", dodge=False)
    fig.canvas.draw()
    boxes = [t.get_window_extent() for t in fig.axes[0].get_xticklabels()]
    assert all(a.x1 <= b.x0 for a, b in zip(boxes, boxes[1:], strict=False))


def test_a_bounded_score_can_show_its_range_instead_of_crossing_its_bound():
    frame = pd.DataFrame({"method": ["a"] * 3, "ari": [1.0, 1.0, 0.4]})
    spread = grouped_bars(frame, x="method", y="ari", ylabel="ARI").axes[0]
    ranged = grouped_bars(frame, x="method", y="ari", ylabel="ARI", errorbar="range").axes[0]
    top = [max(line.get_ydata()) for line in spread.lines]
    assert max(top) > 1.0  # mean 0.8 + sd 0.35: above what an ARI can be
    assert max(max(line.get_ydata()) for line in ranged.lines) == 1.0  # the seeds' max
    assert ranged.get_ylabel() == "ARI"


def test_long_legend_entries_wrap_so_the_legend_stays_narrower_than_the_plot():
    names = ["long: Claude (Anthropic)", "wordnet: WordNet 3.0 (Princeton lexicographers)"]
    frame = pd.DataFrame({"d": ["x", "x", "y", "y"], "acc": [1.0, 2, 3, 4], "h": names * 2})
    fig = grouped_bars(frame, x="d", y="acc", hue="h")
    fig.canvas.draw()
    ax = fig.axes[0]
    texts = [t.get_text() for t in ax.get_legend().get_texts()]
    assert all(len(line) <= 22 for text in texts for line in text.split("\n"))
    assert ax.get_legend().get_window_extent().width < ax.get_window_extent().width


def test_the_privacy_figure_keeps_no_dp_apart_and_draws_the_attacks_chance():
    runs = pd.DataFrame(
        {"epsilon": ["no DP", "8", "1"] * 2, "best_acc": [80.0, 79.0, 78.0, 81.0, 79.5, 77.0]}
    )
    share = pd.Series({"no DP": 1.0, "8": 0.3, "1": 0.1})
    fig = privacy_tradeoff(runs, {"prompt attack": share}, ["no DP", "8", "1"], chance=10.0)
    left, right = fig.axes
    data = [line for line in left.lines if len(line.get_xdata()) > 1 and line.get_marker() == "o"]
    assert [list(line.get_xdata()) for line in data] == [["8", "1"]]  # no DP is not a point
    assert any(line.get_ydata()[0] == 80.5 for line in left.lines)  # but its mean, a line
    assert any(list(line.get_ydata()) == [10.0, 10.0] for line in right.lines)  # chance
    assert left.get_ylabel() and right.get_ylabel() and left.get_ylim()[0] == 0


def _points_under_legends(fig) -> list[tuple[float, float]]:
    """Data points (display coordinates) that a legend box covers, over all axes."""
    fig.canvas.draw()
    boxes = [leg.get_window_extent() for leg in fig.legends]
    boxes += [ax.get_legend().get_window_extent() for ax in fig.axes if ax.get_legend()]
    covered = []
    for ax in fig.axes:
        for line in ax.lines:
            xy = line.get_xydata()
            if len(xy) == 0:
                continue
            for x, y in ax.transData.transform(xy):
                if any(box.contains(x, y) for box in boxes):
                    covered.append((x, y))
        for patch in ax.patches:  # bars: their top edge
            bbox = patch.get_window_extent()
            if bbox.width and any(box.contains(bbox.x0 + bbox.width / 2, bbox.y1) for box in boxes):
                covered.append((bbox.x0, bbox.y1))
    return covered


def test_no_legend_hides_a_data_point_in_any_figure():
    runs = pd.DataFrame(
        {"epsilon": ["no DP", "8", "1"] * 2, "best_acc": [80.0, 79.0, 78.0, 81.0, 79.5, 77.0]}
    )
    shares = {"prompt attack": pd.Series({"no DP": 1.0, "8": 0.3, "1": 0.1})}
    methods = METHODS
    curves = _curves(methods)
    scatter = pd.DataFrame({"m": methods * 2, "t1": range(24), "t5": range(24)})
    bars = pd.DataFrame({"d": ["x", "y"] * 6, "acc": range(12), "h": list("abc") * 4})
    figures = [
        privacy_tradeoff(runs, shares, ["no DP", "8", "1"], chance=10.0),
        accuracy_curves(curves, panel="panel", line="method"),
        paired_scatter(scatter, "t1", "t5", "m", "top-1", "top-5"),
        grouped_bars(bars, x="d", y="acc", hue="h"),
    ]
    for fig in figures:
        assert _points_under_legends(fig) == []
        assert all(ax.get_ylabel() for ax in fig.axes)  # every axis says what it measures

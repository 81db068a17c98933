"""Figures of the paper from run tables: bars with seed error bars, curves, scatter plots.

Every function takes a tidy frame (one row per run, as `fedtsp.paper.experiments.runs_table`
builds it) and returns a matplotlib Figure sized and labelled for print.
"""

from __future__ import annotations

import textwrap
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import matplotlib.pyplot as plt
import pandas as pd
import seaborn as sns
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from fedtsp.paper.statistics import std_interval, summary_frame

if TYPE_CHECKING:
    from fedtsp.paper.experiments import RunSpec

sns.set_theme(style="whitegrid", context="paper", font_scale=1.1)


def grouped_bars(
    frame: pd.DataFrame,
    x: str,
    y: str,
    hue: str | None = None,
    ylabel: str = "accuracy (%)",
    title: str = "",
    order: list[Any] | None = None,
    hue_order: list[Any] | None = None,
    dodge: bool = True,
    errorbar: str = "std",
) -> Figure:
    """Mean of `y` per (x, hue) with the seeds' sample standard deviation as error bars
    (`statistics.std_interval`: the spread the tables print; none for one seed), or with
    `errorbar="range"` the seeds' minimum to maximum (for a bounded score such as the ARI,
    whose mean + sd can pass its bound).

    Bars start at zero, so their lengths compare honestly; long category names are wrapped
    instead of rotated; the legend sits outside the axes, and a `hue` with one value goes
    into the title instead. `dodge=False` colours bars by `hue` without splitting the slot.
    """
    hues = frame[hue].nunique() if hue else 0
    names = list(order) if order is not None else list(dict.fromkeys(frame[x]))
    wrapped = [textwrap.fill(str(name), _WRAP) for name in names]
    lines = max(label.count("\n") + 1 for label in wrapped)
    longest = max(len(line) for label in wrapped for line in label.split("\n"))
    # Inches per category: room for its bars and for its name (about 0.085 in a character).
    slot = max(0.5 * (hues if hue and dodge else 1), 0.085 * longest + 0.15)
    fig, ax = plt.subplots(figsize=(min(max(4.5, slot * len(names) + 1.5), 16), 3.4 + 0.2 * lines))
    sns.barplot(
        data=frame,
        x=x,
        y=y,
        hue=hue,
        order=names,
        hue_order=hue_order,
        errorbar={"std": std_interval, "range": ("pi", 100)}[errorbar],
        dodge=dodge,
        capsize=0.1,
        err_kws={"linewidth": 1.0},
        ax=ax,
    )
    ax.set_xticks(range(len(names)), wrapped)
    ax.set_ylabel(ylabel)
    ax.set_xlabel("")
    if hue and hues == 1:
        ax.get_legend().remove()
        title = (
            f"{title} ({hue}: {frame[hue].iloc[0]})" if title else f"{hue}: {frame[hue].iloc[0]}"
        )
    elif hue:
        _legend_outside(ax, hue)
    ax.set_title(title)
    fig.tight_layout()
    return fig


_WRAP = 16  # characters per line of a category name under a bar


def _legend_outside(ax: Any, title: str) -> None:
    """The axes' legend to the right of the plot, where it hides no data, its entries
    wrapped so that it stays narrower than the plot."""
    sns.move_legend(
        ax, "upper left", bbox_to_anchor=(1.01, 1.0), title=title, fontsize=8, title_fontsize=9
    )
    for text in ax.get_legend().get_texts():
        text.set_text(textwrap.fill(text.get_text(), _LEGEND_WRAP))


_LEGEND_WRAP = 22  # characters per line of a legend entry


@dataclass(frozen=True)
class SeriesStyle:
    colour: tuple[float, float, float]
    dashes: str | tuple[float, float]  # "" = solid
    width: float


# Twelve colours told apart at print size: tab10 (its grey included) and a dark teal and a
# dark gold it lacks; FedTSP's own lines are black.
_BASELINE_COLOURS = [*sns.color_palette("tab10", 10), (0.0, 0.42, 0.42), (0.65, 0.5, 0.0)]
_OURS_COLOURS = [(0.0, 0.0, 0.0), (0.55, 0.0, 0.0), (0.0, 0.0, 0.45)]
_DASHES: list[str | tuple[float, float]] = ["", (4, 1.5), (1.5, 1.5)]


def series_styles(levels: Sequence[str]) -> dict[str, SeriesStyle]:
    """One style per series, no two alike: FedTSP's (labels starting "FedTSP") black and dark
    colours, thicker; the others twelve distinct colours, then again with dashes."""
    ours = [name for name in levels if str(name).startswith("FedTSP")]
    others = [name for name in levels if name not in ours]
    styles = {}
    for group, colours, width in ((ours, _OURS_COLOURS, 2.0), (others, _BASELINE_COLOURS, 1.2)):
        for i, name in enumerate(group):
            dash = _DASHES[(i // len(colours)) % len(_DASHES)]
            styles[name] = SeriesStyle(colours[i % len(colours)], dash, width)
    return {name: styles[name] for name in levels}


def accuracy_curves(
    curves: pd.DataFrame, panel: str, line: str, title: str = "", ylabel: str = "accuracy (%)"
) -> Figure:
    """Accuracy per round (columns `round`, `acc`), one panel per `panel` value, one line
    per `line` value, mean over seeds with a band of one sample standard deviation.

    Each line has its own colour (`series_styles`: ours in black, thicker); rounds are whole
    numbers; one legend for all panels sits to their right.
    """
    panels = list(dict.fromkeys(curves[panel]))
    levels = list(dict.fromkeys(curves[line]))
    styles = series_styles(levels)
    palette = {name: style.colour for name, style in styles.items()}
    dashes = {name: style.dashes for name, style in styles.items()}
    fig, axes = plt.subplots(1, len(panels), figsize=(4.6 * len(panels) + 1.6, 3.8), squeeze=False)
    for ax, value in zip(axes[0], panels, strict=True):
        sns.lineplot(
            data=curves[curves[panel] == value],
            x="round",
            y="acc",
            hue=line,
            style=line,
            hue_order=levels,
            style_order=levels,
            palette=palette,
            dashes=dashes,
            size=line,
            sizes={name: style.width for name, style in styles.items()},
            size_order=levels,
            errorbar=std_interval,
            err_kws={"alpha": 0.12},
            ax=ax,
        )
        ax.set_title(f"{value}")
        ax.set_ylabel(ylabel)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        handles, labels = ax.get_legend_handles_labels()
        ax.get_legend().remove()
    fig.legend(handles, labels, loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig


def privacy_tradeoff(
    runs: pd.DataFrame,
    attacks: dict[str, pd.Series],
    order: Sequence[str],
    chance: float,
    title: str = "",
) -> Figure:
    """Table 4 as two panels on one row of privacy settings (`order`: "no DP", then each
    epsilon): left, accuracy (%) per setting, mean with the seeds' sd (`runs`: columns
    epsilon, best_acc), the no-DP run a reference line rather than a point joined to the
    epsilons; right, the share (%) of class names each attack recovers (`attacks`: name ->
    share per setting, 0-1) with the attack's chance level (%) drawn in."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(9.5, 3.6))
    acc = summary_frame(runs, ["epsilon"], "best_acc").set_index("epsilon").reindex(order)
    private = [e for e in order if e != "no DP"]
    left.errorbar(private, acc.loc[private, "mean"], yerr=acc.loc[private, "std"].fillna(0),
                  marker="o", capsize=3, color="black", label="with DP")  # fmt: skip
    if "no DP" in acc.index and not pd.isna(acc.loc["no DP", "mean"]):
        mean, sd = acc.loc["no DP", "mean"], acc.loc["no DP", "std"]
        left.axhline(mean, color="tab:blue", linestyle="--", label="no DP (mean)")
        if not pd.isna(sd):
            left.axhspan(mean - sd, mean + sd, color="tab:blue", alpha=0.12, label="no DP (± sd)")
    # From zero: a zoomed axis would make seed noise look like a privacy cost.
    left.set_ylim(0, 1.15 * float((acc["mean"] + acc["std"].fillna(0)).max()))
    left.set(xlabel="epsilon", ylabel="accuracy (%)", title="accuracy")
    left.legend(loc="lower left", fontsize=8)
    for (name, share), marker in zip(attacks.items(), "s^v", strict=False):
        right.plot(order, 100 * share.reindex(order), marker=marker, label=name)
    right.axhline(chance, color="grey", linestyle=":", label=f"chance ({chance:.1f} %)")
    right.set(xlabel="privacy setting", ylabel="class names recovered (%)", ylim=(-2, 102))
    right.set_title("attack on the uploaded embeddings")
    right.legend(loc="center right", fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig


def paired_scatter(
    frame: pd.DataFrame, x: str, y: str, label: str, xlabel: str, ylabel: str, title: str = ""
) -> Figure:
    """One point per `label`, e.g. top-1 vs top-5 accuracy: the mean over seeds with the
    seeds' sample sd on both axes as error bars. Each label has its own colour and marker
    (`series_styles`) and is named in a legend to the right of the plot, in the points'
    vertical order: no name sits on the data and no line crosses another."""
    means = frame.groupby(label, sort=False)[[x, y]].mean().sort_values(y, ascending=False)
    spread = frame.groupby(label, sort=False)[[x, y]].std().reindex(means.index)
    styles = series_styles(list(means.index))
    fig, ax = plt.subplots(figsize=(6.8, 4.4))
    for i, (name, row) in enumerate(means.iterrows()):
        ax.errorbar(
            row[x],
            row[y],
            xerr=_or_zero(spread.loc[name, x]),
            yerr=_or_zero(spread.loc[name, y]),
            marker=_MARKERS[i % len(_MARKERS)],
            markersize=6 if styles[name].width > 1.5 else 5,
            color=styles[name].colour,
            elinewidth=0.8,
            capsize=2,
            linestyle="none",
            label=str(name),
        )
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, title=label)
    fig.tight_layout()
    return fig


_MARKERS = "oDs^vP*Xph<>"


def _or_zero(value: float) -> float:
    return 0.0 if pd.isna(value) else float(value)


def curves_frame(
    specs: Sequence[RunSpec], records: Sequence[dict[str, Any]], keys: Iterable[str] | None = None
) -> pd.DataFrame:
    """Long frame (labels..., seed, key, round, acc in %) from run records' per-round
    history: the runs whose key is in `keys` (every run when None), each key once."""
    wanted = None if keys is None else set(keys)
    rows, seen = [], set()
    for spec, rec in zip(specs, records, strict=True):
        if rec["key"] in seen or (wanted is not None and rec["key"] not in wanted):
            continue
        seen.add(rec["key"])
        for h in rec["history"]:
            rows.append(
                {**spec.labels, "seed": rec["config"]["seed"], "key": rec["key"]}
                | {"round": h["round"], "acc": 100 * h["acc"]}
            )
    return pd.DataFrame(rows)


def rounds_to_reach(curves: pd.DataFrame, by: list[str], fraction: float = 0.95) -> pd.DataFrame:
    """First round at which each run reaches `fraction` of its own best accuracy (speed)."""

    def first(part: pd.DataFrame) -> int:
        target = fraction * part["acc"].max()
        return int(part.loc[part["acc"] >= target, "round"].min())

    per_run = (
        curves.groupby([*by, "seed"], sort=False)[["round", "acc"]]
        .apply(first)
        .rename("round")
        .reset_index()
    )
    return summary_frame(per_run, by, "round")

"""Figures of the paper from run tables: bars with seed error bars, curves, scatter plots.

Every function takes a tidy frame (one row per run, as `fedtsp.paper.experiments.runs_table`
builds it) and returns a matplotlib Figure sized and labelled for print.
"""

from __future__ import annotations

from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.figure import Figure

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
    zoom: bool = True,
    dodge: bool = True,
) -> Figure:
    """Mean of `y` per (x, hue) with the seeds' standard deviation as error bars.

    `zoom` starts the axis just below the lowest bar so that small gaps stay visible;
    `dodge=False` colours bars by `hue` without splitting the slot (one hue per x).
    """
    per_slot = frame[hue].nunique() if hue and dodge else 1
    width = max(4.5, 0.55 * frame[x].nunique() * per_slot + 2)
    fig, ax = plt.subplots(figsize=(min(width, 14), 3.8))
    sns.barplot(
        data=frame,
        x=x,
        y=y,
        hue=hue,
        order=order,
        hue_order=hue_order,
        errorbar="sd",
        dodge=dodge,
        capsize=0.1,
        err_kws={"linewidth": 1.0},
        ax=ax,
    )
    if zoom:
        means = frame.groupby([x] + ([hue] if hue else []))[y].mean()
        low, high = means.min(), frame[y].max()
        ax.set_ylim(max(0.0, low - 0.15 * max(high - low, 1.0)), high + 0.1 * max(high - low, 1.0))
    ax.set_ylabel(ylabel)
    ax.set_xlabel("")
    ax.set_title(title)
    ax.tick_params(axis="x", rotation=30 if frame[x].nunique() > 4 else 0)
    if hue:
        ax.legend(title=hue, fontsize=8, title_fontsize=9, loc="lower right")
    fig.tight_layout()
    return fig


def accuracy_curves(
    curves: pd.DataFrame, panel: str, line: str, title: str = "", ylabel: str = "accuracy (%)"
) -> Figure:
    """Accuracy per round (columns `round`, `acc`), one panel per `panel` value, one line
    per `line` value, mean over seeds with a band of one standard deviation."""
    panels = list(dict.fromkeys(curves[panel]))
    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 3.8), squeeze=False)
    for ax, value in zip(axes[0], panels, strict=True):
        sns.lineplot(
            data=curves[curves[panel] == value],
            x="round",
            y="acc",
            hue=line,
            errorbar="sd",
            ax=ax,
            linewidth=1.3,
        )
        ax.set_title(f"{value}")
        ax.set_ylabel(ylabel)
        ax.legend(fontsize=7, ncol=2, loc="lower right")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig


def paired_scatter(
    frame: pd.DataFrame, x: str, y: str, label: str, xlabel: str, ylabel: str, title: str = ""
) -> Figure:
    """One point per `label` (mean over seeds) with its name, e.g. top-1 vs top-5 accuracy."""
    means = frame.groupby(label, sort=False)[[x, y]].mean()
    fig, ax = plt.subplots(figsize=(5.5, 4.2))
    ax.scatter(means[x], means[y], s=28, color="tab:blue")
    for name, row in means.iterrows():
        ax.annotate(
            str(name), (row[x], row[y]), fontsize=7, xytext=(3, 3), textcoords="offset points"
        )
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    fig.tight_layout()
    return fig


def curves_frame(records: list[dict[str, Any]], labels: list[dict[str, Any]]) -> pd.DataFrame:
    """Long frame (labels..., seed, round, acc in %) from run records' per-round history."""
    rows = []
    for rec, lab in zip(records, labels, strict=True):
        for h in rec["history"]:
            rows.append(
                {**lab, "seed": rec["config"]["seed"], "round": h["round"], "acc": 100 * h["acc"]}
            )
    return pd.DataFrame(rows)


def rounds_to_reach(curves: pd.DataFrame, by: list[str], fraction: float = 0.95) -> pd.DataFrame:
    """First round at which each run reaches `fraction` of its own best accuracy (speed)."""

    def first(part: pd.DataFrame) -> int:
        target = fraction * part["acc"].max()
        return int(part.loc[part["acc"] >= target, "round"].min())

    return (
        curves.groupby([*by, "seed"], sort=False)[["round", "acc"]]
        .apply(first)
        .rename("round")
        .reset_index()
        .groupby(by, sort=False)["round"]
        .agg(["mean", lambda v: float(np.std(v)), "count"])
        .set_axis(["mean", "std", "n"], axis=1)
        .reset_index()
    )

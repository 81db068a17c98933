"""Tables from run records: mean +- std over seeds of the numbers a paper table reports.

    python -m fedtsp.report RUNS_DIR [--group algorithm dataset alpha]

prints a Markdown table (one row per group) followed by the provenance of every run
behind it: dataset source and checksum, seeds, code version.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from fedtsp.results import RunStore
from fedtsp.tables import mean_pm_std, to_markdown


def runs_frame(records: Iterable[dict[str, Any]]) -> pd.DataFrame:
    """One row per complete run: its config fields plus summary numbers."""
    rows = []
    for rec in records:
        if rec.get("status") != "complete":
            continue
        trained = [r for r in rec["history"] if "bytes_up_per_client" in r]
        rows.append(
            {
                **{k: v for k, v in rec["config"].items() if k != "algo_options"},
                "key": rec["key"],
                "best_acc": rec["summary"]["best_acc"],
                "last5_acc": rec["summary"]["last5_mean_acc"],
                "best_top5": rec["summary"]["best_top5"],
                "best_round": rec["summary"]["best_round"],
                "wall_s": rec["timings"]["rounds_wall"],
                "kib_per_round": np.mean(
                    [r["bytes_up_per_client"] + r["bytes_down_per_client"] for r in trained]
                )
                / 1024
                if trained
                else 0.0,
                "git_commit": (rec.get("git_commit") or "unknown")[:10],
                "git_dirty": rec.get("git_dirty"),
                "data_source": rec["dataset"]["source"],
                "data_checksum": rec["dataset"]["checksum"][:12],
            }
        )
    return pd.DataFrame(rows)


def summary_table(frame: pd.DataFrame, group: list[str]) -> pd.DataFrame:
    """Mean and std over seeds, per group; accuracies in percent."""

    def agg(part: pd.DataFrame) -> pd.Series:
        def pm(col: str, scale: float = 100.0) -> str:
            values = part[col].to_numpy() * scale
            return mean_pm_std(values.mean(), values.std(ddof=0), len(values))

        return pd.Series(
            {
                "seeds": ",".join(str(s) for s in sorted(part["seed"])),
                "best-round acc (%)": pm("best_acc"),
                "last-5 mean acc (%)": pm("last5_acc"),
                "best top-5 (%)": pm("best_top5"),
                "wall per run (s)": f"{part['wall_s'].mean():.0f}",
                "KiB per client per round (up+down)": f"{part['kib_per_round'].mean():.1f}",
            }
        )

    table = frame.groupby(group, sort=False).apply(agg, include_groups=False)
    # Best method first, by mean best-round accuracy.
    order = frame.groupby(group, sort=False)["best_acc"].mean().sort_values(ascending=False)
    return table.loc[order.index].reset_index()


def provenance(frame: pd.DataFrame) -> str:
    lines = []
    for col in ("data_source", "data_checksum", "git_commit", "git_dirty"):
        values = sorted({str(v) for v in frame[col]})
        lines.append(f"- {col}: {', '.join(values)}")
    lines.append(f"- runs: {', '.join(sorted(frame['key']))}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Summarise a run store as a Markdown table.")
    parser.add_argument("runs", type=Path)
    parser.add_argument("--group", nargs="+", default=["algorithm"])
    args = parser.parse_args(argv)
    frame = runs_frame(RunStore(args.runs).records())
    if frame.empty:
        raise SystemExit(f"no complete run records in {args.runs}")
    table = summary_table(frame, args.group)
    fixed = [
        c
        for c in ("dataset", "alpha", "num_clients", "fraction", "family", "rounds", "local_epochs")
        if frame[c].nunique() == 1
    ]
    print("Setting: " + ", ".join(f"{c}={frame[c].iloc[0]}" for c in fixed) + "\n")
    print(to_markdown(table))
    print("\nProvenance:\n" + provenance(frame))


if __name__ == "__main__":
    main()

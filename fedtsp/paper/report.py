"""Tables from run records: mean +- std over seeds of the numbers a paper table reports.

    python -m fedtsp.paper.report RUNS_DIR [--group algorithm dataset alpha]

prints a Markdown table of the federated runs (one row per group) followed by the provenance
of every run behind it: dataset source and checksum, seeds, code version. The FMCL benchmark
records in the same store get a table of their own (one row per population and method).
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from fedtsp.core.results import RunStore
from fedtsp.paper.fmcl.benchmark import METHODS as FMCL_METHODS
from fedtsp.paper.fmcl.benchmark import benchmark_row, is_benchmark_record, summarize_benchmark
from fedtsp.paper.statistics import cell, summarize
from fedtsp.paper.tables import to_markdown


def runs_frame(records: Iterable[dict[str, Any]]) -> pd.DataFrame:
    """One row per complete federated run: its config fields plus summary numbers."""
    rows = []
    for rec in records:
        if rec.get("status") != "complete" or is_benchmark_record(rec):
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
    """Mean and sample std over seeds, per group; accuracies in percent."""

    def agg(part: pd.DataFrame) -> pd.Series:
        def pm(col: str, scale: float = 100.0) -> str:
            return summarize(part[col] * scale).cell()

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


def fmcl_table(records: Iterable[dict[str, Any]]) -> pd.DataFrame:
    """The FMCL benchmark records: one row per (population, method), mean ± std over seeds."""
    rows = [benchmark_row(r) for r in records if is_benchmark_record(r)]
    summary = summarize_benchmark(pd.DataFrame(rows))
    order = {m: i for i, m in enumerate(FMCL_METHODS)}
    summary = summary.sort_values(
        ["population", "method"], key=lambda c: c.map(order) if c.name == "method" else c
    ).reset_index(drop=True)

    def pm(row: pd.Series, metric: str, scale: float = 1.0, digits: int = 2) -> str:
        n = int(row["seeds"])
        mean, std = row[f"{metric}_mean"] * scale, row[f"{metric}_std"] * scale
        return cell(mean, std, n, digits)

    return pd.DataFrame(
        {
            "population": summary["population"],
            "method": summary["method"],
            "seeds": summary["seeds"],
            "best acc (%)": [pm(r, "best_acc", 100) for _, r in summary.iterrows()],
            "clusters": [pm(r, "num_clusters") for _, r in summary.iterrows()],
            "ARI": [pm(r, "ari", digits=3) for _, r in summary.iterrows()],
        }
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Summarise a run store as a Markdown table.")
    parser.add_argument("runs", type=Path)
    parser.add_argument("--group", nargs="+", default=["algorithm"])
    args = parser.parse_args(argv)
    records = list(RunStore(args.runs).records())
    frame = runs_frame(records)
    clustered = [r for r in records if is_benchmark_record(r) and r.get("status") == "complete"]
    if frame.empty and not clustered:
        raise SystemExit(f"no complete run records in {args.runs}")
    if not frame.empty:
        table = summary_table(frame, args.group)
        fixed = [
            c
            for c in (
                "dataset",
                "alpha",
                "num_clients",
                "fraction",
                "family",
                "rounds",
                "local_epochs",
            )
            if frame[c].nunique() == 1
        ]
        print("Setting: " + ", ".join(f"{c}={frame[c].iloc[0]}" for c in fixed) + "\n")
        print(to_markdown(table))
        print("\nProvenance:\n" + provenance(frame))
    if clustered:
        print(f"\nFMCL benchmark ({len(clustered)} records):\n")
        print(to_markdown(fmcl_table(clustered)))


if __name__ == "__main__":
    main()

"""The pilot of the cpu evidence: how long runs must be to plateau, and how much the paired
differences the claims use vary from seed to seed.

`python -m fedtsp.paper.pilot [--plan] [--workers 2]` runs the headline methods on CIFAR-10
and CIFAR-100 at the cpu profile's data setting (20 clients, a fifth of the images,
Dir(0.1), htfe-cpu, the profile's method options) for a long schedule, at seeds kept apart
from the tests' (100 and up, each with its own partition), into `results/pilot/runs`, and
writes `results/pilot/pilot.{md,json}`: rounds to plateau per method and dataset, the
standard deviation of each paired difference at several schedule lengths (a run's history
up to round r is the run it would have been with r rounds, except AlignFed's, whose anchor
weight decays over the configured rounds), the label prior, and the wall time per run.
The analysis plan (`fedtsp.paper.claims.analysis_plan`) takes its schedule and seeds from these.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from fedtsp.core.atomic import atomic_write_text
from fedtsp.core.results import PLATEAU_RULE, PLATEAU_WITHIN, converged
from fedtsp.paper.claims.registry import paper_gains
from fedtsp.paper.claims.rule import ALPHA
from fedtsp.paper.experiments import DataSource, RunSpec, method_config, run_all
from fedtsp.paper.floors import record_label_prior
from fedtsp.paper.profiles import load_profile
from fedtsp.paper.statistics import paired_power, seeds_for_power, summarize

PROFILE = "cpu"  # whose data setting and method options the pilot uses
DATASETS = ("cifar10", "cifar100")
METHODS = ("FedTSP-MiniLM", "FedProto", "FedTGP", "AlignFed", "Local")
OURS = "FedTSP-MiniLM"
# Seeds 100-102: the tests use seeds below 100, so no test seed's partition or training
# draws were seen when the schedule and the number of seeds were chosen.
SEEDS = (100, 101, 102)
# 5 local epochs (the paper's) per round, 50 rounds: 250 epochs. A probe at seed 99 (Local)
# was still rising at 30 epochs on CIFAR-100; per epoch, 5 per round costs a third less
# than 1 per round (evaluation and prototype passes once a round).
ROUNDS = 50
LOCAL_EPOCHS = 5
# Schedule lengths (rounds) at which the paired differences' spread is reported.
CHECKPOINTS = (10, 20, 30, 40, 50)
POWER = 0.8  # the power the analysis plan asks of each part
SMOOTH = 5  # evaluations in the moving mean that finds the plateau's start


def pilot_specs() -> list[RunSpec]:
    """Every pilot run, labelled by method and dataset."""
    profile = load_profile(PROFILE)
    base = {
        **profile.base,
        "rounds": ROUNDS,
        "local_epochs": LOCAL_EPOCHS,
        "global_eval_every": ROUNDS,
        "partition_seed": "seed",
    }
    options = profile.extra.get("method_options", {})
    return [
        RunSpec(
            method_config(base, method, options, seed=seed, dataset=dataset),
            {"method": method, "dataset": dataset},
        )
        for dataset in DATASETS
        for method in METHODS
        for seed in SEEDS
    ]


def plateau_round(accs: list[float], rounds: list[int]) -> int:
    """The first round whose moving mean (over `SMOOTH` evaluations) comes within
    `PLATEAU_WITHIN` of the highest moving mean of the run."""
    if len(accs) < SMOOTH:
        return rounds[-1]
    smooth = np.convolve(accs, np.ones(SMOOTH) / SMOOTH, mode="valid")
    first = int(np.argmax(smooth >= smooth.max() - PLATEAU_WITHIN))
    return rounds[first + SMOOTH - 1]


def runs_frame(specs: list[RunSpec], records: list[dict[str, Any]]) -> pd.DataFrame:
    """One row per run: labels, seed, label prior, plateau facts, wall time, and its
    best-round accuracy (%) as if it had stopped at each of `CHECKPOINTS`."""
    rows = []
    for spec, rec in zip(specs, records, strict=True):
        accs = [h["acc"] for h in rec["history"]]
        rounds = [h["round"] for h in rec["history"]]
        row = {
            **spec.labels,
            "seed": rec["config"]["seed"],
            "key": rec["key"],
            "label_prior": record_label_prior(rec),
            "converged": converged(accs),
            "plateau_round": plateau_round(accs, rounds),
            "wall_s": rec["timings"]["rounds_wall"],
        }
        for r in CHECKPOINTS:
            upto = [a for a, rnd in zip(accs, rounds, strict=True) if rnd <= r]
            row[f"best_{r}"] = 100 * max(upto)
            row[f"last5_{r}"] = 100 * float(np.mean(upto[-5:]))
            row[f"converged_{r}"] = converged(upto)
        rows.append(row)
    return pd.DataFrame(rows)


def paired_spread(frame: pd.DataFrame, value: str) -> pd.DataFrame:
    """Mean and sample sd of OURS minus each other method, paired by seed, per dataset, and
    the seeds a paired t-test needs for `POWER` to find the paper's gain on that dataset
    (Table 1, Dir(0.1)) at level `ALPHA` / 2 (Holm over a claim's two datasets, worst case).
    """
    gains = paper_gains(0.1)
    rows = []
    for dataset, part in frame.groupby("dataset", sort=False):
        ours = part[part["method"] == OURS].set_index("seed")[value]
        effect = gains.get((dataset, 0.1), math.nan)
        for method in [m for m in METHODS if m != OURS]:
            other = part[part["method"] == method].set_index("seed")[value]
            seeds = sorted(set(ours.index) & set(other.index))
            s = summarize(ours[seeds] - other[seeds])
            needed = (
                seeds_for_power(lambda n, e=effect, sd=s.std: paired_power(e, sd, n, ALPHA / 2))
                if s.n > 1 and s.std > 0
                else None
            )
            rows.append(
                {
                    "dataset": dataset,
                    "comparison": f"{OURS} - {method}",
                    "mean": s.mean,
                    "sd": s.std,
                    "n": s.n,
                    "paper_gain": effect,
                    "seeds_for_power": needed,
                }
            )
    return pd.DataFrame(rows)


def analyse(frame: pd.DataFrame) -> dict[str, Any]:
    """The pilot's findings as plain data (written to pilot.json)."""
    per_method = []
    for (dataset, method), part in frame.groupby(["dataset", "method"], sort=False):
        per_method.append(
            {
                "dataset": dataset,
                "method": method,
                "plateau_rounds": [int(r) for r in part["plateau_round"]],
                "converged": int(part["converged"].sum()),
                "runs": len(part),
                "best_acc": round(float(part[f"best_{ROUNDS}"].mean()), 2),
                "above_label_prior": round(
                    float((part[f"best_{ROUNDS}"] - part["label_prior"]).mean()), 2
                ),
                "wall_s": round(float(part["wall_s"].median()), 1),
            }
        )
    spreads = []
    for r in CHECKPOINTS:
        for value in ("best", "last5"):
            table = paired_spread(frame, f"{value}_{r}")
            for row in table.to_dict("records"):
                spreads.append({"rounds": r, "value": value, **_rounded(row)})
    priors = frame.drop_duplicates(["dataset", "seed"])
    return {
        "setting": {
            "profile": PROFILE,
            "datasets": list(DATASETS),
            "methods": list(METHODS),
            "seeds": list(SEEDS),
            "rounds": ROUNDS,
            "local_epochs": LOCAL_EPOCHS,
        },
        "plateau_rule": PLATEAU_RULE,
        "label_prior": {
            str(ds): {
                int(s): round(float(v), 2) for s, v in zip(p["seed"], p["label_prior"], strict=True)
            }
            for ds, p in priors.groupby("dataset", sort=False)
        },
        "methods": per_method,
        "paired_differences": spreads,
        "wall_s_total": round(float(frame["wall_s"].sum()), 1),
    }


def _rounded(row: dict[str, Any]) -> dict[str, Any]:
    return {
        k: round(v, 3) if isinstance(v, float) and not math.isnan(v) else v for k, v in row.items()
    }


def report(result: dict[str, Any]) -> str:
    """pilot.md: the findings for a reader."""
    s = result["setting"]
    lines = [
        "# Pilot of the cpu evidence",
        "",
        f"{', '.join(s['methods'])} on {', '.join(s['datasets'])} at the `{s['profile']}` "
        f"profile's data setting, {s['rounds']} rounds x {s['local_epochs']} local epochs, "
        f"seeds {', '.join(map(str, s['seeds']))} (each its own partition; no test uses them). "
        "Written by `python -m fedtsp.paper.pilot` from the records in `results/pilot/runs`.",
        "",
        f"Plateau rule: {result['plateau_rule']}. Rounds to plateau: the first round whose "
        f"moving mean over {SMOOTH} evaluations is within {100 * PLATEAU_WITHIN:g} point of "
        "the run's highest moving mean.",
        "",
        "## Rounds to plateau, accuracy and wall time",
        "",
        "| dataset | method | rounds to plateau (per seed) | converged | best acc (%) | "
        "above label prior (points) | wall per run (s, median; other work shared the "
        "machine) |",
        "|---|---|---|---|---:|---:|---:|",
    ]
    for m in result["methods"]:
        lines.append(
            f"| {m['dataset']} | {m['method']} | {', '.join(map(str, m['plateau_rounds']))} | "
            f"{m['converged']} of {m['runs']} | {m['best_acc']:.2f} | "
            f"{m['above_label_prior']:+.2f} | {m['wall_s']:.0f} |"
        )
    lines += [
        "",
        "Label prior (%) per seed: "
        + "; ".join(
            f"{ds} " + ", ".join(f"{v:.1f}" for v in seeds.values())
            for ds, seeds in result["label_prior"].items()
        )
        + ".",
        "",
        "## Paired differences (FedTSP minus each method, by seed): mean and sample sd",
        "",
        f"Seeds for {POWER:.0%} power: the fewest seeds with which a paired t-test at level "
        f"{ALPHA / 2:g} ({ALPHA:g} Holm-corrected over two datasets, worst case) finds the "
        "paper's Table 1 gain on that dataset at Dir(0.1), given this sd (more than 100: "
        "'> 100').",
        "",
        "| rounds | value | dataset | comparison | mean | sd | paper's gain | seeds for power |",
        "|---:|---|---|---|---:|---:|---:|---:|",
    ]
    for d in result["paired_differences"]:
        needed = d.get("seeds_for_power")
        needed = None if needed is None or needed != needed else int(needed)  # NaN: none
        lines.append(
            f"| {d['rounds']} | {d['value']} | {d['dataset']} | {d['comparison']} | "
            f"{d['mean']:+.2f} | {d['sd']:.2f} | {d['paper_gain']:+.2f} | "
            f"{'> 100' if needed is None else needed} |"
        )
    lines += [
        "",
        f"Wall time of all pilot runs: {result['wall_s_total'] / 3600:.2f} h (summed).",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fedtsp.paper.pilot", description=__doc__)
    parser.add_argument("--results", default="results", help="results root (default: results)")
    parser.add_argument("--workers", type=int, default=2, help="parallel runs (default 2)")
    parser.add_argument("--plan", action="store_true", help="list the runs and stop")
    args = parser.parse_args(argv)
    specs = pilot_specs()
    store = Path(args.results) / "pilot" / "runs"
    if args.plan:
        for spec in specs:
            print(spec.labels["dataset"], spec.labels["method"], spec.config.seed)
        print(f"{len(specs)} runs of {ROUNDS} rounds x {LOCAL_EPOCHS} epochs into {store}")
        return 0
    source = DataSource(load_profile(PROFILE).data)
    records = run_all(specs, source, store, workers=args.workers)
    result = analyse(runs_frame(specs, records))
    out = store.parent
    atomic_write_text(out / "pilot.json", json.dumps(result, indent=1) + "\n")
    atomic_write_text(out / "pilot.md", report(result))
    print(f"wrote {out / 'pilot.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

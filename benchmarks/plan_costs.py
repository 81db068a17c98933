"""What a reproduction from an empty run store would cost, per profile: ``--plan``'s figures.

    python benchmarks/plan_costs.py [--profiles cpu paper]

Plans each profile against an empty results folder (nothing runs) and writes
``benchmarks/results/plan_costs.{json,md}``: the runs, the estimated wall time of running
them all at the profile's workers, per notebook, and how much of it rests on measured twins
(committed runs of the same config at another seed, alpha or schedule) rather than the calibration's lower
bound. Where the profile's device is absent here, the images per architecture stand in.
"""

from __future__ import annotations

import argparse
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

from facts import write_result

from fedtsp.core.paths import REPO_ROOT
from fedtsp.core.results import RunStore
from fedtsp.paper.plan import make_plan
from fedtsp.paper.profiles import load_profile
from fedtsp.paper.reproduce import NOTEBOOKS_DIR, find_notebooks

RESULTS = Path(__file__).resolve().parent / "results"


def plan_cost(profile_name: str) -> dict[str, Any]:
    """The plan of ``profile_name`` from an empty store, as numbers."""
    profile = load_profile(profile_name)
    with tempfile.TemporaryDirectory() as empty:
        runs, _ = make_plan(profile, find_notebooks(NOTEBOOKS_DIR), Path(empty), profile.workers)
    device = profile.base.get("device", "cpu")
    divisor = profile.workers if device == "cpu" else 1
    estimated = all(r.seconds is not None for r in runs)
    per_notebook: Counter[str] = Counter()
    images: Counter[str] = Counter()
    for r in runs:
        per_notebook[r.notebook] += (r.seconds or 0.0) / divisor
        for arch, (train, infer) in r.images.items():
            images[arch] += train + infer
    committed_store = REPO_ROOT / "results" / profile_name / "runs"
    walls = (
        [
            float((r.get("timings") or {}).get("wall") or 0.0)
            for r in RunStore(committed_store).records()
        ]
        if committed_store.is_dir()
        else []
    )
    return {
        "profile": profile_name,
        "committed_records": len(walls),
        "committed_run_seconds": sum(walls),
        "device": device,
        "workers": profile.workers,
        "seeds": profile.seeds,
        "runs": len(runs),
        "from_twins": sum(r.source == "twin" for r in runs),
        "seconds": sum(per_notebook.values()) if estimated else None,
        "per_notebook_seconds": dict(per_notebook) if estimated else None,
        "images_per_architecture": dict(images) if not estimated else None,
    }


def table(plans: list[dict[str, Any]]) -> str:
    lines = [
        "| profile | device, workers | seeds | runs | of them with a measured twin "
        "| estimated wall time of the runs | by notebook | committed records: runs, "
        "their run time summed |",
        "| --- | --- | --- | ---: | ---: | ---: | --- | --- |",
    ]
    for p in plans:
        if p["seconds"] is None:
            images = sum(p["images_per_architecture"].values())
            estimate = f"no estimate here ({images / 1e9:.2f} billion images through the models)"
            by_notebook = "-"
        else:
            estimate = _clock(p["seconds"])
            by_notebook = ", ".join(
                f"{nb[:2]} {_clock(s)}" for nb, s in p["per_notebook_seconds"].items()
            )
        seeds = ", ".join(str(s) for s in p["seeds"])
        committed = (
            f"{p['committed_records']}, {_clock(p['committed_run_seconds'])}"
            if p["committed_records"]
            else "-"
        )
        lines.append(
            f"| `{p['profile']}` | {p['device']}, {p['workers']} | {seeds} | {p['runs']} "
            f"| {p['from_twins']} | {estimate} | {by_notebook} | {committed} |"
        )
    lines += [
        "",
        "`fedtsp reproduce --profile P --plan --results <empty folder>`: every run the "
        "notebooks need, estimated from the rounds of its committed twins (the same config at "
        "any seed, alpha and schedule: median seconds per epoch and per round, times its schedule) "
        "or else by the calibrated client-model work, a lower bound. A run "
        "two notebooks share counts for the first. Notebook-only work (a few minutes) is "
        "not included.",
    ]
    return "\n".join(lines)


def _clock(seconds: float) -> str:
    minutes = int(round(seconds / 60))
    return f"{minutes // 60} h {minutes % 60:02d} min" if minutes >= 60 else f"{minutes} min"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--profiles", nargs="+", default=["cpu", "paper"])
    parser.add_argument("--out", default=str(RESULTS / "plan_costs.json"))
    args = parser.parse_args(argv)
    plans = [plan_cost(name) for name in args.profiles]
    write_result(Path(args.out), {"plans": plans}, table(plans))
    print(table(plans))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

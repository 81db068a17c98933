"""Today's code on the very runs an earlier empty-store reproduction made, from an empty run
store and an empty cache: the like-for-like comparison for the speed issue's target 3.

    python benchmarks/reproduce_same_runs.py [--workers 2] [--precision fp32|bf16] \\
        [--baseline benchmarks/results/reproduce_cpu_empty_store_baseline.json]

The profile has grown since the baseline was measured (a third seed, a partition per seed,
controls, more description sets), so a reproduction of today's profile does other work. The
run set here is the baseline commit's committed cpu store: its federated run configs as they
are, and its FMCL runs rebuilt from their population, method and seed with the notebook's
parameters of then. They run through the batch runner that ``fedtsp reproduce`` uses, with the
profile's workers. The notebooks are not rerun (today's are not those of then); their time
is taken from the committed ``reproduce_times`` output (today's notebooks on today's larger
store, so an upper bound) and reported apart.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from facts import machine_facts, write_result
from reproduce_empty_store import RESULTS, TARGET, _clock

from fedtsp.core.config import RunConfig
from fedtsp.core.paths import REPO_ROOT
from fedtsp.core.results import code_version

# The FMCL notebook's parameters at the baseline's commit (its profiles.toml, cpu section).
BASELINE_FMCL = {
    "num_clients": 12,
    "fraction": 0.1,
    "rounds": 20,
    "local_epochs": 1,
    "arch": "fedavgcnn_s",
    "lr": 0.05,
    "encoder_input_size": 96,
    "partition_seed": 1,
}


def stored_records(commit: str, store: str = "results/cpu/runs") -> list[dict[str, Any]]:
    """Every JSON record of the run store as committed at ``commit``."""

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", *args], cwd=REPO_ROOT, check=True, capture_output=True, text=True
        ).stdout

    names = [
        n for n in git("ls-tree", "-r", "--name-only", commit, store).split() if n.endswith(".json")
    ]
    return [json.loads(git("show", f"{commit}:{name}")) for name in names]


def run_set(records: list[dict[str, Any]], precision: str) -> list[RunConfig]:
    """Today's configs of the stored runs: federated configs as recorded (fields added since
    keep their defaults), FMCL runs from population, method and seed."""
    from fedtsp.paper.fmcl.benchmark import benchmark_config

    configs = []
    for record in records:
        if "config" in record:
            config = RunConfig.from_dict(record["config"])
        else:
            config = benchmark_config(
                record["population_name"], record["method"], record["seed"], **BASELINE_FMCL
            )
        configs.append(RunConfig.from_dict({**config.to_dict(), "precision": precision}))
    return configs


def run_them(configs: list[RunConfig], workers: int, work: Path) -> float:
    """Wall seconds of the batch runner on ``configs`` from an empty store and cache."""
    os.environ["FEDTSP_CACHE"] = str(work / "cache")  # before fedtsp.data reads it
    from fedtsp.paper.experiments import DataSource, RunSpec, run_all

    start = time.perf_counter()
    run_all([RunSpec(c) for c in configs], DataSource("auto"), work / "runs", workers)
    return time.perf_counter() - start


def table(result: dict[str, Any]) -> str:
    before, after = result["before"], result["after"]
    now = after["runs_seconds"] + after["notebooks_seconds"]
    ratio = now / before["seconds"]
    return "\n".join(
        [
            f"The {after['runs']} runs (federated and FMCL) of the cpu reproduction at "
            f"{before['code']}, rerun from an empty run store and cache, {after['workers']} "
            f"workers, precision {after['precision']}",
            "",
            "| | code | runs | notebooks | wall time |",
            "| --- | --- | ---: | ---: | ---: |",
            f"| before | {before['code']} | {_clock(before['runs_seconds'])} "
            f"| {_clock(before['notebooks_seconds'])} | {_clock(before['seconds'])} |",
            f"| now | {result['code']['git_commit'][:7]} | {_clock(after['runs_seconds'])} "
            f"| {_clock(after['notebooks_seconds'])} | {_clock(now)} |",
            "",
            f"Now / before: {ratio:.2f} (target <= {TARGET:.2f}: "
            f"{'met' if ratio <= TARGET else 'not met'}). Before, the FMCL runs ran inside "
            "notebook 08 and count here with the runs; now's notebooks are today's, executed "
            f"on today's store ({after['notebooks_from']}). Before: {before['note']}",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workers", type=int, default=2, help="the cpu profile's: 2")
    parser.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    parser.add_argument(
        "--baseline", default=str(RESULTS / "reproduce_cpu_empty_store_baseline.json")
    )
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    baseline = json.loads(Path(args.baseline).read_text())
    fmcl_seconds = baseline["notebooks"]["08_fmcl"]["seconds"]
    notebooks_then = sum(nb["seconds"] for nb in baseline["notebooks"].values()) - fmcl_seconds
    times = json.loads((RESULTS / "reproduce_times.json").read_text())
    committed = times["profiles"]["cpu"]

    configs = run_set(stored_records(baseline["code"]), args.precision)
    print(f"{len(configs)} runs of {baseline['code']}'s cpu store", flush=True)
    code = code_version()
    work = Path(tempfile.mkdtemp(prefix="fedtsp-same-runs-"))
    try:
        seconds = run_them(configs, args.workers, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result = {
        "what": "today's code on the runs of an earlier empty-store cpu reproduction",
        "before": {
            "code": baseline["code"],
            "seconds": baseline["seconds"],
            "runs_seconds": baseline["runs_seconds"] + fmcl_seconds,
            "notebooks_seconds": notebooks_then,
            "note": baseline["what"],
        },
        "after": {
            "runs": len(configs),
            "workers": args.workers,
            "precision": args.precision,
            "runs_seconds": round(seconds, 1),
            "notebooks_seconds": round(sum(committed["notebooks"].values()), 1),
            "notebooks_from": f"reproduce_times at {times['code']['git_commit'][:7]}",
        },
        "machine": machine_facts(),
    }
    suffix = "" if args.precision == "fp32" else f"_{args.precision}"
    out = Path(args.out or RESULTS / f"reproduce_cpu_same_runs{suffix}.json")
    write_result(out, result, table(result), code)
    print(out.with_suffix(".md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())

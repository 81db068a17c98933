"""The runs of an earlier cpu reproduction, by the code of then and by today's, side by side
on this machine: the like-for-like measure of the speed issue's target 3.

    python benchmarks/audits/reproduce_same_runs.py [--then 4e74747] [--sample 24] [--sample-seed 0]

The one empty-store cpu reproduction on record (``reproduce_cpu_empty_store_baseline.json``)
ran on another machine, and today's profile does more work (a third seed, a partition per
seed, controls, more description sets), so neither its wall time nor a reproduction of
today's profile compares. Here the run set is the federated runs of the baseline commit's
committed cpu store; a random sample of them (``--sample``, 0 = all) is run once by that
commit's code (extracted with ``git archive``, run with its own worker set-up: one torch
thread, the other thread pools left at their defaults, as its batch runner did) and once by
today's (``single_thread_worker``). Each (then, now) pair of one config runs at the same
time, one per core, so both see the same machine; the figure of a run is the wall time its
record holds. The ratio of the sums estimates the whole run set's; its 95 % interval comes
from resampling the pairs. The FMCL runs are left out: the code of then ran them inside
notebook 08 through another interface (824 of its 6,226 s). ``--pairs-from LOG
--measured-at COMMIT`` rebuilds the output from the pairs a measuring run printed.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: shared helpers

from facts import machine_facts, write_result
from reproduce_empty_store import RESULTS, TARGET

from fedtsp.core.paths import REPO_ROOT
from fedtsp.core.results import code_version
from fedtsp.paper.experiments import resolve_data

# One run in a fresh process, printing its record's wall seconds: argv = config JSON, store.
# The code of then (its module layout at 4e74747) and today's, each with its own worker set-up.
RUN_THEN = (
    "import json, sys, torch; torch.set_num_threads(1)\n"
    "from fedtsp.config import RunConfig\n"
    "from fedtsp.experiments import _run_one\n"
    "config = RunConfig.from_dict(json.loads(sys.argv[1]))\n"
    "print(_run_one(config, 'auto', 12, sys.argv[2])['timings']['wall'])\n"
)
RUN_NOW = (
    "import json, sys\n"
    "from fedtsp.core.threads import single_thread_worker; single_thread_worker()\n"
    "from fedtsp.core.config import RunConfig\n"
    "from fedtsp.paper.experiments import DataSource, _run_one\n"
    "config = RunConfig.from_dict(json.loads(sys.argv[1]))\n"
    "print(_run_one(config, DataSource('auto'), sys.argv[2])['timings']['wall'])\n"
)
PAIR_LINE = re.compile(r"^(\d+)/\d+ (\S+) (\S+) then (\d+) s, now (\d+) s$", re.M)


def git(*args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=REPO_ROOT, check=True, capture_output=True, text=True
    ).stdout


def stored_configs(commit: str, store: str = "results/cpu/runs") -> list[dict[str, Any]]:
    """The config of every federated run record in the store as committed at ``commit``,
    ordered by record key (FMCL records, which have no ``config``, are left out)."""
    names = sorted(n for n in git("ls-tree", "-r", "--name-only", commit, store).split())
    records = [json.loads(git("show", f"{commit}:{n}")) for n in names if n.endswith(".json")]
    return [r["config"] for r in records if "config" in r]


def sample(configs: list[dict[str, Any]], size: int, seed: int) -> list[dict[str, Any]]:
    """A simple random sample of ``size`` configs (all of them for size 0), in store order."""
    if size <= 0 or size >= len(configs):
        return list(configs)
    picked = sorted(random.Random(seed).sample(range(len(configs)), size))
    return [configs[i] for i in picked]


def ratio_interval(then: list[float], now: list[float], seed: int = 0) -> list[float]:
    """95 % bootstrap interval of sum(now) / sum(then), resampling the pairs."""
    a, b = np.asarray(then), np.asarray(now)
    draws = np.random.default_rng(seed).integers(0, len(a), size=(10_000, len(a)))
    ratios = b[draws].sum(1) / a[draws].sum(1)
    return [float(np.percentile(ratios, 2.5)), float(np.percentile(ratios, 97.5))]


def verdict(interval: list[float]) -> str:
    """Met when the whole interval is at or below the target, not met when it is above."""
    if interval[1] <= TARGET:
        return "met"
    if interval[0] > TARGET:
        return "not met"
    return "not separated from the target"


def warm_caches(codes: dict[str, Path], work: Path, datasets: set[str]) -> None:
    """Decode the datasets into each code's cache first, so that no pair times a decode."""
    names = sorted(datasets)
    for side, module in (("then", "fedtsp.experiments"), ("now", "fedtsp.paper.experiments")):
        script = f"from {module} import DataSource\nfor n in {names!r}: DataSource('auto').get(n)"
        subprocess.run(
            [sys.executable, "-c", script], cwd=codes[side], env=_env(codes, work, side), check=True
        )


def _env(codes: dict[str, Path], work: Path, side: str) -> dict[str, str]:
    data = resolve_data("auto")
    env = os.environ | {"PYTHONPATH": str(codes[side]), "FEDTSP_CACHE": str(work / side)}
    return env | ({"FEDTSP_DATA": data} if data else {})


def run_pair(config: dict[str, Any], codes: dict[str, Path], work: Path) -> dict[str, float]:
    """The config run by both codes at once, one process each; their records' wall seconds."""

    def one(side: str) -> float:
        script = RUN_THEN if side == "then" else RUN_NOW
        store = str(work / f"{side}-runs")
        done = subprocess.run(
            [sys.executable, "-c", script, json.dumps(config), store],
            cwd=codes[side],
            env=_env(codes, work, side),
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            raise SystemExit(f"a run by the code {side} failed:\n{done.stderr[-3000:]}")
        return float(done.stdout.split()[-1])

    with ThreadPoolExecutor(2) as pool:
        then, now = pool.map(one, ["then", "now"])
    return {"then": then, "now": now}


def measure(picked: list[dict[str, Any]], then: str) -> list[dict[str, Any]]:
    """Every picked config run by the code of ``then`` and today's; one row per pair."""
    work = Path(tempfile.mkdtemp(prefix="fedtsp-same-runs-"))
    try:
        then_dir = work / "code-then"
        then_dir.mkdir()
        archive = subprocess.run(
            ["git", "archive", then], cwd=REPO_ROOT, check=True, capture_output=True
        ).stdout
        subprocess.run(["tar", "-x", "-C", str(then_dir)], input=archive, check=True)
        codes = {"then": then_dir, "now": REPO_ROOT}
        warm_caches(codes, work, {c["dataset"] for c in picked})
        pairs = []
        for i, config in enumerate(picked, 1):
            walls = run_pair(config, codes, work)
            pairs.append(_row(config) | walls)
            print(
                f"{i}/{len(picked)} {config['algorithm']} {config['dataset']} "
                f"then {walls['then']:.0f} s, now {walls['now']:.0f} s",
                flush=True,
            )
        return pairs
    finally:
        shutil.rmtree(work, ignore_errors=True)


def pairs_from_log(text: str, picked: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The pairs a measuring run printed (whole seconds), checked against the sample."""
    found = PAIR_LINE.findall(text)
    if len(found) != len(picked):
        raise SystemExit(f"the log has {len(found)} pairs, the sample {len(picked)}")
    pairs = []
    for (i, algorithm, dataset, then, now), config in zip(found, picked, strict=True):
        if (algorithm, dataset) != (config["algorithm"], config["dataset"]):
            raise SystemExit(f"pair {i} of the log is {algorithm} {dataset}, not the sample's")
        pairs.append(_row(config) | {"then": float(then), "now": float(now)})
    return pairs


def _row(config: dict[str, Any]) -> dict[str, Any]:
    return {k: config[k] for k in ("algorithm", "dataset", "family", "seed", "algo_options")}


def table(result: dict[str, Any]) -> str:
    s = result["summary"]
    low, high = s["ratio_ci95"]
    return "\n".join(
        [
            f"{s['pairs']} of the {result['run_set']} federated runs of the cpu store at "
            f"{result['then']} (a random sample, seed {result['sample_seed']}), each run by "
            "that code and by today's at the same time, one process per core:",
            "",
            "| code | runs | run time summed | per run (median) |",
            "| --- | ---: | ---: | ---: |",
            f"| then ({result['then']}) | {s['pairs']} | {s['then_seconds']:,.0f} s "
            f"| {s['then_median']:.0f} s |",
            f"| now ({result['code']['git_commit'][:7]}) | {s['pairs']} "
            f"| {s['now_seconds']:,.0f} s | {s['now_median']:.0f} s |",
            "",
            f"Now / then: {s['ratio']:.2f} [95 % CI {low:.2f}, {high:.2f}] (target <= "
            f"{TARGET:.2f}: {s['verdict']}; rule: met when the interval lies at or below the "
            "target, not met when it lies above). The FMCL runs are not in it (the code of then "
            "ran them inside notebook 08).",
        ]
        + (
            [
                "Rebuilt with `--pairs-from` from the pairs its measuring run printed (whole "
                "seconds): that run's writer failed after the last pair."
            ]
            if result.get("rebuilt_from_log")
            else []
        )
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--then",
        default="4e74747",
        help="the baseline's commit (RUN_THEN assumes its module layout)",
    )
    parser.add_argument("--sample", type=int, default=24, help="runs to pair; 0: all")
    parser.add_argument("--sample-seed", type=int, default=0)
    parser.add_argument("--out", default=str(RESULTS / "reproduce_cpu_same_runs.json"))
    parser.add_argument(
        "--pairs-from",
        default=None,
        help="a measuring run's printed output: its pairs, not new runs",
    )
    parser.add_argument(
        "--measured-at", default=None, help="with --pairs-from: the package commit it ran"
    )
    args = parser.parse_args(argv)
    if bool(args.pairs_from) != bool(args.measured_at):
        parser.error("--pairs-from and --measured-at go together")
    if resolve_data("auto") is None:
        parser.error("no offline data: set FEDTSP_DATA or put ../shared/data beside the repo")

    configs = stored_configs(args.then)
    picked = sample(configs, args.sample, args.sample_seed)
    if args.pairs_from:
        pairs = pairs_from_log(Path(args.pairs_from).read_text(), picked)
        code = {**code_version(), "git_commit": git("rev-parse", args.measured_at).strip()}
        code["git_dirty"] = False
    else:
        code = code_version()
        pairs = measure(picked, args.then)
    then = [p["then"] for p in pairs]
    now = [p["now"] for p in pairs]
    ratio = sum(now) / sum(then)
    interval = ratio_interval(then, now, args.sample_seed)
    result = {
        "code": code,
        "what": "the federated runs of an earlier cpu reproduction, by its code and today's",
        "then": args.then,
        "run_set": len(configs),
        "sample_seed": args.sample_seed,
        "pairs": pairs,
        "rebuilt_from_log": bool(args.pairs_from),
        "summary": {
            "pairs": len(pairs),
            "then_seconds": round(sum(then), 1),
            "now_seconds": round(sum(now), 1),
            "then_median": float(np.median(then)),
            "now_median": float(np.median(now)),
            "ratio": ratio,
            "ratio_ci95": interval,
            "verdict": verdict(interval),
        },
        "machine": machine_facts(),
    }
    out = Path(args.out)
    write_result(out, result, table(result), code)
    print(out.with_suffix(".md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Fast path beside exact fp32: best-round accuracy over seeds, paired by seed.

    python benchmarks/audits/fast_path_accuracy.py [--methods FedProto FedTSP-MiniLM] \\
        [--seeds 0 1 2] [--data ../shared/data/cifar10-jpg.tar.gz]

Each method (a label of ``[methods]`` in ``fedtsp/paper/profiles.toml``) runs on CIFAR-10
at the cpu profile's setting (its base config and method options: Dir(0.1), 20 clients on a
fifth of the images, htfe-cpu, 20 rounds x 1 local epoch, batch 100) once per seed exactly
(fp32, every client in this process, on the machine's threads) and once on the fast path
(bf16 autocast, the clients split over one process per core, ``--client-workers``), one run
at a time, and reports each run's best test accuracy and wall time. Where the clients run
does not change a history (``engine.client_pool``), so the accuracy difference is bf16's.

Verdict rule, per method: the fast path keeps accuracy when the size of the mean paired
difference (bf16 minus fp32, seed by seed) is at most the sample standard deviation
(ddof = 1) of fp32's best accuracy across the seeds, i.e. the change is within seed noise.
The 95 % t-interval of the paired difference is reported beside it.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: shared helpers

from facts import machine_facts, write_result

from fedtsp.core.paths import REPO_ROOT
from fedtsp.core.results import code_version
from fedtsp.data import load_dataset
from fedtsp.engine.simulation import run_experiment
from fedtsp.paper.experiments import method_config, method_specs
from fedtsp.paper.profiles import load_profile
from fedtsp.paper.statistics import paired_difference, summarize

PRECISIONS = ("fp32", "bf16")


def paired(exact: list[float], fast: list[float]) -> dict[str, Any]:
    """Mean paired difference (fast - exact), its 95 % t-interval and the verdict rule."""
    diff, _ = paired_difference(dict(enumerate(exact)), dict(enumerate(fast)))
    noise = summarize(exact).std
    return {
        "mean_difference": diff.mean,
        "ci95": [diff.ci_low, diff.ci_high],
        "seed_noise": noise,
        "verdict": "within seed noise" if abs(diff.mean) <= noise else "outside seed noise",
    }


def table(result: dict[str, Any]) -> str:
    seeds = result["setting"]["seeds"]
    # Outputs written before the key existed ran on the fixed default partition (1).
    fixed = result["setting"].get("partition_seed", 1) != "seed"
    partition = (
        "whose seeds share one partition, so the noise is that of training alone"
        if fixed
        else "each seed with a partition of its own, so the noise includes the partition"
    )
    lines = [
        "| method | fp32 best acc (%) | bf16 best acc (%) | bf16 - fp32 [95 % CI] "
        "| seed noise (fp32 std) | verdict | fp32 s/run | fast s/run | speed-up |",
        "|---|---:|---:|---:|---:|---|---:|---:|---:|",
    ]
    for label, res in result["methods"].items():
        acc = {p: res[p]["best_acc"] for p in PRECISIONS}
        sec = {p: statistics.median(res[p]["seconds"]) for p in PRECISIONS}
        c = res["comparison"]
        lines.append(
            f"| {label} | {summarize(acc['fp32']).cell()} | {summarize(acc['bf16']).cell()} "
            f"| {c['mean_difference']:+.2f} [{c['ci95'][0]:+.2f}, {c['ci95'][1]:+.2f}] "
            f"| {c['seed_noise']:.2f} | {c['verdict']} "
            f"| {sec['fp32']:.0f} | {sec['bf16']:.0f} | {sec['fp32'] / sec['bf16']:.2f}x |"
        )
    lines += [
        "",
        f"Best-round test accuracy, mean ± sample std (ddof = 1) over seeds {seeds}; the "
        "difference is paired by seed; wall seconds per run are medians. CIFAR-10 at the cpu "
        f"profile's setting, {partition}. Rule: within seed noise when |mean difference| "
        "<= fp32's std.",
    ]
    workers = result["setting"].get("fast_client_workers", 1)
    if workers > 1:  # outputs written before client processes existed ran bf16 alone
        lines.append(
            f"Fast path: bf16 autocast with the clients in {workers} processes of one thread "
            "each; exact: fp32 with every client in one process."
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--methods", nargs="+", default=["FedProto", "FedTSP-MiniLM"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--data", default=None, help="CIFAR-10 archive (default: auto)")
    parser.add_argument(
        "--client-workers",
        type=int,
        default=os.cpu_count() or 1,
        help="client processes of the fast path (default: one per core)",
    )
    parser.add_argument(
        "--out", default=str(REPO_ROOT / "benchmarks" / "results" / "fast_path_accuracy.json")
    )
    args = parser.parse_args(argv)
    unknown = [m for m in args.methods if m not in method_specs()]
    if unknown:
        parser.error(f"unknown method(s) {unknown}; choose from {list(method_specs())}")
    if len(args.seeds) < 3 or len(set(args.seeds)) != len(args.seeds):
        parser.error("--seeds: give at least 3 different seeds (a std needs them)")

    code = code_version()
    facts = machine_facts()
    if not facts["native_bf16"]:
        print("note: this CPU has no native bf16; the bf16 runs will be slow", file=sys.stderr)
    profile = load_profile("cpu")
    options = profile.extra.get("method_options", {})
    dataset = load_dataset("cifar10", args.data)
    methods: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as work:
        for label in args.methods:
            res: dict[str, Any] = {p: {"best_acc": [], "seconds": []} for p in PRECISIONS}
            for seed in args.seeds:
                for precision in PRECISIONS:
                    config = method_config(
                        {**profile.base, "dataset": "cifar10", "alpha": 0.1},
                        label,
                        options,
                        seed=seed,
                        precision=precision,
                    )
                    start = time.perf_counter()
                    record = run_experiment(
                        config,
                        dataset=dataset,
                        out=Path(work) / precision,
                        progress=False,
                        client_workers=args.client_workers if precision == "bf16" else 1,
                    )
                    seconds = time.perf_counter() - start
                    acc = 100 * record["summary"]["best_acc"]
                    res[precision]["best_acc"].append(acc)
                    res[precision]["seconds"].append(seconds)
                    print(f"{label} seed {seed} {precision}: {acc:.2f} % in {seconds:.0f} s")
            res["comparison"] = paired(res["fp32"]["best_acc"], res["bf16"]["best_acc"])
            methods[label] = res
    result = {
        "what": "best-round test accuracy and wall time per run, fp32 vs bf16 autocast",
        "setting": {
            "profile": "cpu",
            "dataset": "cifar10",
            "alpha": 0.1,
            "seeds": args.seeds,
            "partition_seed": profile.base.get("partition_seed", 1),
            "fast_client_workers": args.client_workers,
            "data_checksum": dataset.checksum,
        },
        "machine": facts,
        "methods": methods,
    }
    write_result(Path(args.out), result, table(result), code)
    print(Path(args.out).with_suffix(".md").read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Seconds per round, fedtsp beside HtFLlib, on one exported split in one run.

    python benchmarks/audits/speed_vs_htfllib.py --htfllib /path/to/HtFLlib \\
        [--pythonpath DIR] [--data ../shared/data/cifar10-jpg.tar.gz] \\
        [--fraction 0.2] [--rounds 4] [--repeats 3] [--methods FedProto FedTGP LG-FedAvg]

The workload is the accuracy harness's (``htfllib_side_by_side.py``): CIFAR-10, Dir(0.1),
20 clients, a stratified ``--fraction`` of the images, HtFE2, 1 local epoch, batch 100,
lr 0.01, each method with the settings of the authors' scripts and HtFLlib's protocol, on
the machine's default thread count. Each repeat runs, one after the other: HtFLlib; fedtsp
exact (fp32, every client in one process: today's defaults); exact-procs (fp32, the clients
split over one process per core with one thread each, ``client_workers``: the same
histories, since each client's work does not depend on where it runs); and, where bf16 pays
on this device, fast (bf16 autocast and client processes). A side's seconds per round are
the mean over its training rounds after the first (HtFLlib's own ``time cost`` lines; ours:
the round's wall time plus its checkpoint), and the table gives the median over repeats.

The fast path runs only where a short probe (a few training steps of each architecture of
the family) finds bf16 autocast faster than fp32; otherwise the probe's figures are the
result (``--modes`` forces a choice). Without ``--htfllib`` only fedtsp is measured, and
the output says so. HtFLlib is a measuring instrument here: none of its code is in this
project. Results: ``--out`` (JSON) and the markdown table beside it.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: shared helpers

from bench import train_speed
from facts import machine_facts, write_result
from htfllib_side_by_side import METHODS, base_config, export_split, run_htfllib

from fedtsp.core.paths import REPO_ROOT
from fedtsp.core.results import code_version
from fedtsp.data import load_dataset
from fedtsp.engine.simulation import run_experiment
from fedtsp.models.families import resolve_family

FAMILY = "htfe2"
# Our sides: (precision, client processes; 0 = one per core).
MODES = {"exact": ("fp32", 1), "exact-procs": ("fp32", 0), "fast": ("bf16", 0)}


def ours_seconds(record: dict[str, Any]) -> dict[str, Any]:
    """Seconds per training round after the first (wall + checkpoint) and its phases."""
    rows = record["history"][1:-1] or record["history"][:-1]
    timings = [row["timings"] for row in rows]
    per_round = [row["wall"] + row["timings"].get("checkpoint", 0.0) for row in rows]
    phases = {k: statistics.fmean(t.get(k, 0.0) for t in timings) for k in timings[0]}
    return {"s_per_round": statistics.fmean(per_round), "phases": phases}


def client_workers(mode: str) -> int:
    """The mode's client processes: 1 (in this process) or one per core."""
    workers = MODES[mode][1]
    return workers or (os.cpu_count() or 1)


def mode_label(mode: str) -> str:
    precision, workers = MODES[mode]
    return f"{precision}, {'1 process' if workers == 1 else 'client processes'}"


def bf16_probe(device: str) -> dict[str, dict[str, float]]:
    """Training images/s of each family architecture in fp32 and under bf16 autocast."""
    return {
        arch: {
            precision: train_speed(arch, 100, 2, None, device, warmup=1, precision=precision)
            for precision in ("fp32", "bf16")
        }
        for arch in resolve_family(FAMILY)
    }


def bf16_pays(probe: dict[str, dict[str, float]]) -> bool:
    """Whether a batch of every architecture takes less time in bf16 than in fp32."""
    seconds = {p: sum(1 / speeds[p] for speeds in probe.values()) for p in ("fp32", "bf16")}
    return seconds["bf16"] < seconds["fp32"]


def overhead(runs: list[dict[str, Any]], workers: int = 1) -> float | None:
    """Median share of a round that is neither model nor server time (fedtsp's own cost);
    None where the clients ran in several processes (their model time overlaps)."""
    if workers > 1:
        return None
    shares = [
        (r["s_per_round"] - r["phases"]["model"] - r["phases"]["server"]) / r["s_per_round"]
        for r in runs
    ]
    return statistics.median(shares)


def table(result: dict[str, Any]) -> str:
    modes = result["modes"]
    has_htfllib = result["htfllib"] is not None
    head = ["method", "HtFLlib"] if has_htfllib else ["method"]
    head += [f"fedtsp {m} ({mode_label(m)})" for m in modes]
    head += [f"{m} speed-up" for m in modes] if has_htfllib else []
    head += [f"{m} overhead" for m in modes]
    lines = ["| " + " | ".join(head) + " |", "|---" + "|---:" * (len(head) - 1) + "|"]
    workers = result.get("client_workers", {})  # absent in outputs from before the column
    for label, res in result["methods"].items():
        cells = [label]
        if has_htfllib:
            cells.append(f"{res['htfllib']['median']:.2f}")
        cells += [f"{res[m]['median']:.2f}" for m in modes]
        if has_htfllib:
            cells += [f"{res['htfllib']['median'] / res[m]['median']:.2f}x" for m in modes]
        shares = [overhead(res[m]["runs"], workers.get(m) or 1) for m in modes]
        cells += ["-" if share is None else f"{100 * share:.2f} %" for share in shares]
        lines.append("| " + " | ".join(cells) + " |")
    s = result["setting"]
    lines += [
        "",
        f"Seconds per round, median of {s['repeats']} repeats (CIFAR-10 Dir(0.1), 20 clients, "
        f"fraction {s['fraction']}, HtFE2, 1 local epoch, batch 100, {s['rounds']} rounds).",
    ]
    lines.append(
        "Overhead: wall time minus model and server time, as a share of the round "
        "(median over repeats); not defined with client processes, whose model time overlaps."
    )
    if any((workers.get(m) or 1) > 1 for m in modes):
        lines.append(
            "Client processes: the clients split over "
            + ", ".join(f"{workers[m]} processes ({m})" for m in modes if (workers.get(m) or 1) > 1)
            + " with one thread each (`client_workers`, `engine.client_pool`)."
        )
    if has_htfllib:
        lines.append(f"HtFLlib at commit {result['htfllib']}, run by its own `main.py`.")
    else:
        lines.append("HtFLlib not run: no --htfllib checkout was given.")
    if "fast" not in modes:
        probe = ", ".join(
            f"{arch} {v['fp32']:,.0f} -> {v['bf16']:,.0f}" for arch, v in result["probe"].items()
        )
        lines.append(
            f"Fast path (bf16) not run: bf16 autocast is slower than fp32 on this device "
            f"(training images/s, fp32 -> bf16: {probe})."
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--htfllib", help="HtFLlib checkout (holds system/); omit: ours only")
    parser.add_argument("--htfllib-version", help="its commit, where --htfllib is no git checkout")
    parser.add_argument("--pythonpath", help="extra import folder for HtFLlib's packages")
    parser.add_argument("--data", default=None, help="CIFAR-10 archive (default: auto)")
    parser.add_argument("--fraction", type=float, default=0.2)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--methods", nargs="+", default=["FedProto", "FedTGP", "LG-FedAvg"])
    parser.add_argument("--modes", nargs="+", choices=list(MODES), help="default: see above")
    parser.add_argument(
        "--out", default=str(REPO_ROOT / "benchmarks" / "results" / "speed_vs_htfllib.json")
    )
    args = parser.parse_args(argv)
    unknown = [m for m in args.methods if m not in METHODS]
    if unknown:
        parser.error(f"unknown method(s) {unknown}; choose from {list(METHODS)}")
    if args.htfllib and not (Path(args.htfllib) / "system" / "main.py").exists():
        parser.error(f"--htfllib {args.htfllib}: no system/main.py there (an HtFLlib checkout?)")
    args.protocol, args.threads = "htfllib", torch.get_num_threads()  # what the harness reads

    code = code_version()  # what is measured: the code as it is now
    probe = bf16_probe("cpu")
    modes = args.modes or ["exact", "exact-procs"] + (["fast"] if bf16_pays(probe) else [])
    dataset = load_dataset("cifar10", args.data)
    base = base_config(args)
    name = f"Cifar10_fedtsp_frac{args.fraction:g}"
    if args.htfllib:
        export_split(base, dataset, Path(args.htfllib) / "dataset" / name)
    sides = (["htfllib"] if args.htfllib else []) + modes
    result: dict[str, Any] = {
        "what": "seconds per training round after the first; median over repeats",
        "setting": {
            "family": f"{FAMILY} = HtFLlib HtFE-img-2",
            "fraction": args.fraction,
            "rounds": args.rounds,
            "repeats": args.repeats,
            "protocol": "htfllib",
            "data_checksum": dataset.checksum,
        },
        "machine": machine_facts(),
        "htfllib": None,
        "modes": modes,
        "client_workers": {m: client_workers(m) for m in modes},
        "probe": probe,
        "methods": {},
    }
    if args.htfllib:
        from htfllib_side_by_side import _htfllib_version

        result["htfllib"] = args.htfllib_version or _htfllib_version(Path(args.htfllib))
    runs = {label: {side: {"runs": []} for side in sides} for label in args.methods}
    with tempfile.TemporaryDirectory() as work:
        for repeat in range(args.repeats):  # repeats outermost: a slow spell hits every side
            for label in args.methods:
                algorithm, options, method_args = METHODS[label]
                for side in sides:
                    if side == "htfllib":
                        log = Path(work) / f"{label}-{repeat}.log"
                        other = run_htfllib(args, Path(args.htfllib), name, method_args, 0, log)
                        if "error" in other:
                            raise SystemExit(f"HtFLlib {label} failed: {other['error']}")
                        measured = {"s_per_round": other["s_per_round"]}
                    else:
                        config = base.replace(
                            algorithm=algorithm, algo_options=options, precision=MODES[side][0]
                        )
                        store = Path(work) / f"runs-{side}-{repeat}"
                        record = run_experiment(
                            config,
                            dataset=dataset,
                            out=store,
                            progress=False,
                            client_workers=client_workers(side),
                        )
                        measured = ours_seconds(record)
                    runs[label][side]["runs"].append(measured)
                    print(
                        f"repeat {repeat} {label} {side}: {measured['s_per_round']:.2f} s/round",
                        flush=True,
                    )
    for label, by_side in runs.items():
        for res in by_side.values():
            res["median"] = statistics.median(r["s_per_round"] for r in res["runs"])
        result["methods"][label] = by_side
    markdown = table(result)
    write_result(Path(args.out), result, markdown, code)
    print(markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A regression set for engine refactors: every method's histories, to compare bit for bit.

    python tools/regression_set.py record [--out tools/regression_set.json]
    python tools/regression_set.py check  [--out tools/regression_set.json] [--only NAME ...]

``record`` runs, with the CPU kernels pinned to AVX2 (fedtsp.core.isa), every registered
algorithm in each setting it is defined for, on real CIFAR-10 at a tiny scale (4 clients, 2 % of the images, 2 rounds, seeds 0 and 1), a few of
them a second time interrupted after round 1 and resumed, and every FMCL benchmark method on
a small CIFAR-100 label-groups population; it writes each run's history and summary (and a
clustered method's clusters), without the timings. ``check``
reruns the same list and names every run whose history differs in any value. Exact equality
holds with one thread and the same kernels and library versions, on any x86-64 machine with
AVX2 when both sides are pinned; a change that alters results on purpose says which runs and
why, then records the set again.

The runs named by ``GOLDEN`` (one of each method kind) are the golden pinned histories: the
test suite reruns them on whatever machine runs it, so every CI run on every developer
machine checks that the pins give the recording machine's bits there too.
"""

from __future__ import annotations

# First: pins the CPU kernels (fedtsp.core.isa) before torch and NumPy load.
import fedtsp  # noqa: F401

# isort: split
import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

from fedtsp.algorithms import ALGORITHMS
from fedtsp.core import isa
from fedtsp.core.config import RunConfig
from fedtsp.core.machine import cpu_class, same_class
from fedtsp.core.paths import REPO_ROOT
from fedtsp.core.results import code_version
from fedtsp.data import load_dataset
from fedtsp.engine.simulation import run_experiment
from fedtsp.paper.fmcl.benchmark import METHODS as FMCL_METHODS
from fedtsp.paper.fmcl.benchmark import benchmark_config

DEFAULT_OUT = REPO_ROOT / "tools" / "regression_set.json"
SEEDS = (0, 1)
# FedTSP-MiniLM with trainable prompts (and its resume), a prototype baseline, AlignFed's
# anchors (NumPy QR), and the FMCL benchmark's FMCL and PACFL (embeddings, SVD, clustering).
GOLDEN = (
    "fedtsp/htfl/seed0",
    "fedtgp/htfl/seed0",
    "alignfed/htfl/seed0",
    "fmcl:fmcl/seed0",
    "fmcl:pacfl/seed0",
)
RESUMED = ("fedproto", "fedtsp", "fml", "fedgen", "fedkd")  # server state of each kind
FAMILIES = {"htfl": "htfe-cpu", "gfl": "homo-cpu", "pfl": "homo-cpu"}
# Values that measure time, not the computation.
UNTIMED = {"timings", "wall", "wall_seconds", "cluster_seconds", "train_seconds"}


def base_config() -> RunConfig:
    return RunConfig(
        dataset="cifar10",
        num_clients=4,
        fraction=0.02,
        rounds=2,
        local_epochs=1,
        batch_size=20,
        feature_dim=None,
        global_eval_every=1,
    )


def federated_runs() -> list[tuple[str, RunConfig, bool]]:
    """(name, config, resumed) for every algorithm, setting and seed of the set."""
    runs = []
    for name, method in sorted(ALGORITHMS.items()):
        for setting in method.settings:
            for seed in SEEDS:
                config = base_config().replace(
                    algorithm=name, setting=setting, family=FAMILIES[setting], seed=seed
                )
                label = f"{name}/{setting}/seed{seed}"
                runs.append((label, config, False))
                if name in RESUMED and setting == "htfl" and seed == 0:
                    runs.append((label + "/resumed", config, True))
    return runs


def _untimed(value: Any) -> Any:
    """`value` without its timings, as JSON would give it back (so equality is exact)."""

    def strip(v: Any) -> Any:
        if isinstance(v, dict):
            return {k: strip(x) for k, x in v.items() if k not in UNTIMED}
        if isinstance(v, list | tuple):
            return [strip(x) for x in v]
        return v

    return json.loads(json.dumps(strip(value), default=float))


def run_federated(config: RunConfig, resumed: bool, store: Path, dataset: Any) -> dict:
    if resumed:  # interrupted after round 1, then resumed from its checkpoint
        run_experiment(config, dataset=dataset, out=store, progress=False, stop_after=1)
        record = run_experiment(config, dataset=dataset, out=store, progress=False, resume=True)
    else:
        record = run_experiment(config, dataset=dataset, out=store, progress=False, force=True)
    out = {"history": _untimed(record["history"]), "summary": _untimed(record["summary"])}
    return out | ({"server": _untimed(record["server"])} if "server" in record else {})


def population_runs() -> list[tuple[str, RunConfig]]:
    """(name, config) of every FMCL benchmark method on a small label-groups population."""
    return [
        (
            f"fmcl:{method}/seed{seed}",
            benchmark_config("label-groups", method, seed, num_clients=8, fraction=0.02, rounds=2),
        )
        for method in FMCL_METHODS
        for seed in SEEDS
    ]


def regression_set(only: list[str] | None = None) -> dict[str, dict]:
    torch.set_num_threads(1)
    dataset = load_dataset("cifar10", None)
    results: dict[str, dict] = {}

    def wanted(label: str) -> bool:
        return not only or any(label.startswith(o) for o in only)

    with tempfile.TemporaryDirectory() as tmp:
        for label, config, resumed in federated_runs():
            if wanted(label):
                store = Path(tmp) / label.replace("/", "_")
                results[label] = run_federated(config, resumed, store, dataset)
                print(f"{label}: best acc {results[label]['summary'].get('best_acc')}", flush=True)
        population = None
        for label, config in population_runs():
            if wanted(label):
                population = population or {"cifar100": load_dataset("cifar100", None)}
                store = Path(tmp) / label.replace("/", "_").replace(":", "_")
                results[label] = run_federated(config, False, store, population)
                print(f"{label}: best acc {results[label]['summary'].get('best_acc')}", flush=True)
    return results


def differences(
    expected: dict[str, dict], actual: dict[str, dict], partial: bool = False
) -> list[str]:
    out = [] if partial else [f"{k}: recorded but not run" for k in expected if k not in actual]
    for label, run in actual.items():
        if label not in expected:
            out.append(f"{label}: not in the recorded set")
        elif _recorded_part(run, expected[label]) != expected[label]:
            rows = [
                i
                for i, (a, b) in enumerate(
                    zip(run["history"], expected[label]["history"], strict=False)
                )
                if a != b
            ]
            out.append(f"{label}: differs (history rows {rows or 'equal; summary or length'})")
    return out


def _recorded_part(run: dict, expected: dict) -> dict:
    """`run` with only the summary fields the recorded set has: a field added to summaries
    later is derived from the history, which is compared in full."""
    summary = {k: v for k, v in run.get("summary", {}).items() if k in expected.get("summary", {})}
    return run | {"summary": summary}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("command", choices=("record", "check"))
    parser.add_argument("--out", default=str(DEFAULT_OUT))
    parser.add_argument("--only", nargs="+", help="run labels (prefixes) to run, for check")
    args = parser.parse_args(argv)
    out = Path(args.out)
    if args.command == "record":
        if args.only:
            parser.error("record writes the whole set; --only is for check")
        if not isa.state().pinned:
            parser.error(f"record the set with the AVX2 pins, not {isa.tag()}")
        runs = regression_set()
        payload = {
            "code_version": code_version(),
            "cpu": cpu_class(),
            "isa": isa.describe(),
            "versions": isa.versions(),
            "runs": runs,
        }
        out.write_text(json.dumps(payload, indent=1, sort_keys=True) + "\n")
        print(f"recorded {len(runs)} runs")
        return 0
    if not out.exists():
        parser.error(f"--out {out}: no recorded set there; run `record` first")
    recorded = json.loads(out.read_text())
    expected = recorded["runs"]
    found = differences(expected, regression_set(args.only), partial=bool(args.only))
    print("\n".join(found) if found else "every run is identical to the recorded set")
    if found:
        print("\n".join(f"note: {why}" for why in unlike(recorded)))
    return 1 if found else 0


def unlike(recorded: dict[str, Any]) -> list[str]:
    """What differs between the recording process and this one that can change every bit."""
    notes = []
    kernels = (recorded.get("isa") or {}).get("tag")
    if kernels != isa.tag() and same_class(recorded.get("cpu"), cpu_class()) is not True:
        notes.append(
            f"the set was recorded with the kernels {kernels or 'of its CPU (unpinned)'} on "
            f"{isa.cpu_words(recorded.get('cpu') or {})}, this process runs {isa.tag()}"
        )
    versions = recorded.get("versions")
    if versions and versions != isa.versions():
        notes.append(f"the set was recorded with {versions}, this process has {isa.versions()}")
    return notes


if __name__ == "__main__":
    sys.exit(main())

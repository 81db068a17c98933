"""Side by side with HtFLlib: the shared baselines on one exported split, accuracy and speed.

    python benchmarks/audits/htfllib_side_by_side.py --htfllib /path/to/HtFLlib \
        [--htfllib-tree 6e6f1ae DIR] [--pythonpath DIR] [--protocol htfllib|fedtsp] \
        [--fraction 0.1] [--rounds 10] [--seeds 0 1 2] [--methods ...]

HtFLlib (github.com/TsingZ0/HtFLlib) is a measuring instrument here: none of its code is in
this project. ``--htfllib`` is a checkout of it (the folder holding ``system/main.py``);
``--htfllib-tree COMMIT DIR`` another commit of it, for the rows of ``HTFLLIB_AT``;
``--pythonpath`` a folder with the extra packages its ``main.py`` imports (h5py, ujson,
calmsize, higher, click, requests). Its three FedKTL servers import StyleGAN / Stable
Diffusion code that is not needed here; the launcher puts empty modules in their place.

What runs: one Dir(0.1) partition of CIFAR-10 over 20 clients (a stratified ``--fraction``
of the merged images) is drawn by fedtsp and exported in HtFLlib's layout to
``<htfllib>/dataset/<name>/``; every method then runs in both with family HtFE2 (HtFLlib's
``HtFE-img-2``: FedAvgCNN + ResNet-18), d = 512, 1 local epoch, batch 100, lr 0.01 and
``--rounds`` rounds (HtFLlib ``-gr R`` = R + 1 evaluations, like ours), once per seed, with
the method settings of the authors' scripts. With ``--protocol htfllib`` (the default) our
side also follows HtFLlib's protocol: ``batch_order="fixed"`` (its loaders do not shuffle),
``client_init="shared"`` (it reseeds torch before building each client, so clients of one
architecture start identical) and ``undersized_clients="skip"`` (its ``drop_last=True``
loader gives a client smaller than one batch no batch); ``--protocol fedtsp`` keeps ours,
and the other protocols change one field of ours each. HtFLlib has no seed
option (every seeding call in it is ``torch.manual_seed(0)``); the launcher shifts those
calls by the repeat's seed, so both sides' repeats vary the seed (seed 0 is HtFLlib
unchanged). Beyond that, HtFLlib is not deterministic (unseeded ``random`` / ``numpy``).

Our method options are set to what HtFLlib's code does where we have the variant
(``METHODS``); the remaining known departures are in ``DEPARTURES``, printed with the
table. Target: |difference of the means| <= max(1.5 points, 2 x the larger std).

Results: ``--out`` (JSON, every run's best accuracy and seconds per round) and the markdown
table beside it. Runs already recorded (our run store, HtFLlib logs under ``--work``) are
reused, so an interrupted comparison resumes.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedtsp.core.config import RunConfig
from fedtsp.core.paths import REPO_ROOT, portable_path
from fedtsp.core.results import code_version, short_commit
from fedtsp.data import load_dataset
from fedtsp.data.htfllib import export_htfllib
from fedtsp.engine.build import partition_dataset
from fedtsp.engine.simulation import run_experiment, run_key
from fedtsp.paper.statistics import summarize

# label -> (our algorithm, our options matching HtFLlib's code, HtFLlib's algorithm + args)
METHODS: dict[str, tuple[str, dict[str, Any], list[str]]] = {
    "Local": ("local", {}, ["-algo", "Local"]),
    "FedProto": ("fedproto", {"eval_mode": "prototype"}, ["-algo", "FedProto", "-lam", "1"]),
    "FedTGP": (
        "fedtgp",
        {"eval_mode": "prototype"},
        ["-algo", "FedTGP", "-lam", "1", "-se", "100", "-mart", "100"],
    ),
    "FedGH": ("fedgh", {}, ["-algo", "FedGH", "-slr", "0.01", "-se", "100"]),
    "FedGen": (
        "fedgen",
        {},
        ["-algo", "FedGen", "-nd", "32", "-glr", "0.1", "-hd", "512", "-se", "100"],
    ),
    "LG-FedAvg": ("lg-fedavg", {}, ["-algo", "LG-FedAvg"]),
    "FML": ("fml", {}, ["-algo", "FML", "-al", "0.5", "-bt", "0.5"]),
    "FD": ("feddistill", {}, ["-algo", "FD", "-lam", "1"]),
    "FD, softmax target": ("feddistill", {}, ["-algo", "FD", "-lam", "1"]),
    "FedKD": (
        "fedkd",
        {"compress": True},
        ["-algo", "FedKD", "-mlr", "0.01", "-Ts", "0.95", "-Te", "0.95"],
    ),
    "FedMRL": (
        "fedmrl",
        {"grad_clip": None, "test_batch_stats": False},  # upstream: no clip, eval mode at test
        ["-algo", "FedMRL", "-sfd", "128"],
    ),
}

# Rows run against another HtFLlib commit, given with --htfllib-tree COMMIT DIR: 6e6f1ae is
# the parent of ca3e29a (2025-11-29), which switched FD's target to the raw global logits.
HTFLLIB_AT: dict[str, str] = {"FD, softmax target": "6e6f1ae"}

# Known differences that remain between the two sides (ours -> HtFLlib's code).
DEPARTURES: dict[str, str] = {
    "FD": "since Nov 2025 (ca3e29a) HtFLlib distils towards the raw global logits (ours: "
    "towards their softmax, as the FedTSP authors' fork and HtFLlib before that; the row "
    "'FD, softmax target' runs HtFLlib at 6e6f1ae, just before that change)",
    "FedKD": "HtFLlib SVD-compresses the full mentee weights (ours: the update since the last "
    "global weights)",
}

HTFLLIB_FAMILY = "HtFE-img-2"
STUB = """
import os, runpy, sys, types
import torch
torch.set_num_threads({threads})
# HtFLlib has no seed option: every seeding call it makes is torch.manual_seed(0). Shifting
# them all by the repeat's seed gives repeat s the start HtFLlib would have with seed s.
_manual_seed = torch.manual_seed
torch.manual_seed = lambda seed: _manual_seed(seed + {seed})
sys.path.insert(0, os.getcwd())
for name in ("serverktl_stylegan_xl", "serverktl_stylegan_3", "serverktl_stable_diffusion"):
    module = types.ModuleType("flcore.servers." + name)
    module.FedKTL = None
    sys.modules[module.__name__] = module
sys.argv = ["main.py"] + sys.argv[1:]
runpy.run_path("main.py", run_name="__main__")
"""


# --protocol: our side's batch order, initial weights and small clients. "htfllib" mirrors
# HtFLlib's loaders (shuffle=False, drop_last=True: a client smaller than one batch never
# trains) and seeding (every client's model built right after torch.manual_seed); "fedtsp"
# is our default; the others change one field of it, to tell their effects apart.
_HTFLLIB = {"batch_order": "fixed", "client_init": "shared", "undersized_clients": "skip"}
_FEDTSP = {"batch_order": "shuffled", "client_init": "independent", "undersized_clients": "train"}
PROTOCOLS = {
    "htfllib": _HTFLLIB,
    "fedtsp": _FEDTSP,
    "fixed-order": {**_FEDTSP, "batch_order": "fixed"},
    "shared-start": {**_FEDTSP, "client_init": "shared"},
    "skip-undersized": {**_FEDTSP, "undersized_clients": "skip"},
}


def results_file(folder: Path, protocol: str) -> Path:
    """Where a protocol's results go: the HtFLlib protocol's is the main comparison."""
    tail = "" if protocol == "htfllib" else f"_{protocol}_protocol"
    return folder / f"htfllib_side_by_side{tail}.json"


def base_config(args: argparse.Namespace) -> RunConfig:
    return RunConfig(
        dataset="cifar10",
        alpha=0.1,
        num_clients=20,
        fraction=args.fraction,
        family="htfe2",
        rounds=args.rounds,
        local_epochs=1,
        batch_size=100,
        lr=0.01,
        feature_dim=512,
        **PROTOCOLS[args.protocol],
    )


def export_split(config: RunConfig, dataset: Any, folder: Path) -> None:
    """Write the run's partition in HtFLlib's layout (skipped when it is already there)."""
    # Keyed by what draws the split: the protocol fields do not change it.
    key = run_key(config.replace(algorithm="local", **PROTOCOLS["fedtsp"]), dataset)
    written = folder / "config.json"
    if written.exists() and json.loads(written.read_text()).get("fedtsp_key") == key:
        return
    images, labels, partition = partition_dataset(config, dataset)
    export_htfllib(folder, images, labels, partition, {"fedtsp_key": key})


def check_same_split(folder: Path, record: dict[str, Any]) -> None:
    """The exported files hold exactly the class counts our run trained and tested on."""
    for sub, key in (("train", "train_class_counts"), ("test", "test_class_counts")):
        for i, expected in enumerate(record["partition"][key]):
            with np.load(folder / sub / f"{i}.npz", allow_pickle=True) as f:
                y = f["data"].tolist()["y"]
            counts = np.bincount(y, minlength=len(expected)).tolist()
            if counts != list(expected):
                raise SystemExit(f"exported {sub}/{i}.npz differs from our run's split")


def run_ours(config: RunConfig, dataset: Any, store: Path) -> dict[str, Any]:
    record = run_experiment(config, dataset=dataset, out=store, resume=True, progress=False)
    trained = [row["wall"] for row in record["history"][:-1]]  # the last row only evaluates
    # Clients with fewer training samples than one batch: HtFLlib's loader (drop_last=True)
    # gives them no batch at all, ours one partial batch; their share of our best accuracy.
    sizes = [sum(c) for c in record["partition"]["train_class_counts"]]
    tests = [sum(c) for c in record["partition"]["test_class_counts"]]
    best = max(record["history"], key=lambda row: row["acc"])
    small = [i for i, n in enumerate(sizes) if n < config.batch_size]
    return {
        "best_acc": 100 * record["summary"]["best_acc"],
        "undersized": {
            "clients": small,
            "test_samples": sum(tests[i] for i in small),
            "all_test_samples": sum(tests),
            "points": 100 * sum(tests[i] * best["client_acc"][i] for i in small) / sum(tests),
        },
        "accs": [round(100 * row["acc"], 2) for row in record["history"]],
        "s_per_round": statistics.fmean(trained[1:] or trained),  # like HtFLlib: not the first
        "key": record["key"],
        "commit": short_commit(record),
        "record": record,
    }


def parse_htfllib(log: str) -> dict[str, Any]:
    lines = log.splitlines()
    accs = [
        100 * float(m.group(1))
        for m in (re.search(r"Averaged Test Accura?n?cy: ([0-9.]+)", line) for line in lines)
        if m
    ]
    times = [
        float(m.group(1))
        for m in (re.match(r"^-{25,}.*?([0-9]+\.[0-9]+(?:e-?[0-9]+)?)\s*$", line) for line in lines)
        if m
    ]
    if "Best accuracy." not in lines or not accs:
        raise RuntimeError("HtFLlib run did not finish (no 'Best accuracy.' line)")
    return {
        "best_acc": max(accs),
        "accs": [round(a, 2) for a in accs],
        "s_per_round": statistics.fmean(times[1:]) if len(times) > 1 else float("nan"),
    }


def run_htfllib(
    args: argparse.Namespace,
    root: Path,
    name: str,
    method_args: list[str],
    seed: int,
    log_path: Path,
) -> dict[str, Any]:
    if log_path.exists():
        try:
            return parse_htfllib(log_path.read_text())
        except RuntimeError:
            pass  # an interrupted run: run it again
    command = [
        sys.executable,
        "-c",
        STUB.format(threads=args.threads, seed=seed),
        *["-data", name, "-ncl", "10", "-m", HTFLLIB_FAMILY, "-fd", "512", "-nc", "20"],
        *["-lbs", "100", "-lr", "0.01", "-ls", "1", "-gr", str(args.rounds), "-jr", "1"],
        *["-eg", "1", "-dev", "cpu", "-t", "1"],
        *method_args,
    ]
    env = dict(os.environ, TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD="1", OMP_NUM_THREADS=str(args.threads))
    if args.pythonpath:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [args.pythonpath, env.get("PYTHONPATH")]))
    system = root / "system"
    done = subprocess.run(command, cwd=system, env=env, capture_output=True, text=True)
    shutil.rmtree(system / "temp", ignore_errors=True)  # its per-round model pickles
    log_path.write_text(done.stdout + done.stderr)
    if done.returncode != 0:
        tail = (done.stdout + done.stderr).strip().splitlines()[-1:] or ["(no output)"]
        return {"error": tail[0], "returncode": done.returncode}
    return parse_htfllib(done.stdout)


def table(results: dict[str, Any]) -> str:
    rows = [
        "| method | fedtsp best acc (%) | HtFLlib best acc (%) | difference | tolerance "
        "| within | s / round fedtsp | s / round HtFLlib |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for label, res in results["methods"].items():
        ours, theirs = res["ours"], res["htfllib"]
        if not theirs["best_acc"]:
            failed = f"failed: {theirs['errors'][0]}"
            rows.append(f"| {label} | {_pm(ours['best_acc'])} | {failed} | - | - | - | - | - |")
            continue
        diff, tol = res["difference"], res["tolerance"]
        rows.append(
            f"| {label} | {_pm(ours['best_acc'])} | {_pm(theirs['best_acc'])} | {diff:+.2f} "
            f"| {tol:.2f} | {'yes' if res['within'] else 'no'} | {ours['s_per_round']:.2f} "
            f"| {theirs['s_per_round']:.2f} |"
        )
    notes = [f"- {k}: {v}" for k, v in results["departures"].items()]
    shares = [
        (max(u["points"] for u in res["ours"]["undersized"]), label)
        for label, res in results["methods"].items()
        if "undersized" in res["ours"]
    ]
    if shares and results["setting"].get("undersized_clients", "train") == "train":
        first = next(iter(results["methods"].values()))["ours"]["undersized"][0]
        most, where = max(shares)
        notes.append(
            "- all: clients with fewer training samples than one batch train on that one "
            "partial batch here; HtFLlib's loader (drop_last=True) gives them none, so they "
            f"never train ({len(first['clients'])} of {results['setting']['num_clients']} "
            f"clients, {first['test_samples']} of {first['all_test_samples']} test samples; "
            f"they make at most {most:.2f} points of our best accuracy, in {where})"
        )
    lines = rows + ["", "Known departures (ours -> HtFLlib):", *notes]
    by_code: dict[str, list[str]] = {}  # a stored run keeps the code it ran at
    for label, res in results["methods"].items():
        for commit in dict.fromkeys(res["ours"].get("commits", [])):
            by_code.setdefault(commit, []).append(label)
    if by_code:
        runs = "; ".join(f"{commit} for {' / '.join(labels)}" for commit, labels in by_code.items())
        lines += ["", f"fedtsp code of our runs: {runs}."]
    return "\n".join(lines) + "\n"


def protocol_table(by_protocol: dict[str, dict[str, Any]]) -> str:
    """Our side's best accuracy under each protocol measured, beside HtFLlib, per method."""
    names = [name for name in PROTOCOLS if name in by_protocol]
    header = " | ".join(f"fedtsp, {name} protocol" for name in names)
    rows = [f"| method | {header} | HtFLlib |", "|---" * (len(names) + 2) + "|"]
    for label, res in by_protocol["htfllib"]["methods"].items():
        cells = [
            _pm(by_protocol[name]["methods"][label]["ours"]["best_acc"])
            if label in by_protocol[name]["methods"]
            else "-"
            for name in names
        ]
        theirs = _pm(res["htfllib"]["best_acc"]) if res["htfllib"]["best_acc"] else "failed"
        rows.append(f"| {label} | {' | '.join(cells)} | {theirs} |")
    return "\n".join(rows) + "\n"


def _pm(values: list[float]) -> str:
    """The project's "mean ± std" cell for a list of per-seed values."""
    return summarize(values).cell()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--htfllib", required=True, help="HtFLlib checkout (holds system/)")
    parser.add_argument("--pythonpath", help="extra import folder for HtFLlib's packages")
    parser.add_argument("--htfllib-version", help="its commit, where --htfllib is no git checkout")
    parser.add_argument("--data", default=None, help="CIFAR-10 archive (default: auto)")
    parser.add_argument("--fraction", type=float, default=0.1)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    parser.add_argument(
        "--htfllib-tree",
        nargs=2,
        action="append",
        default=[],
        metavar=("COMMIT", "DIR"),
        help="HtFLlib at another commit, for the rows that need it (see HTFLLIB_AT)",
    )
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument(
        "--work",
        default=str(Path(tempfile.gettempdir()) / "fedtsp-htfllib"),
        help="scratch folder: our run store and HtFLlib's logs (default: in the temp folder)",
    )
    parser.add_argument(
        "--protocol",
        choices=list(PROTOCOLS),
        default="htfllib",
        help="our side's batch order and initial weights (see PROTOCOLS; default: HtFLlib's)",
    )
    parser.add_argument("--out", help="results JSON (default: benchmarks/results/, by protocol)")
    args = parser.parse_args(argv)
    if args.out is None:
        args.out = str(results_file(REPO_ROOT / "benchmarks" / "results", args.protocol))
    trees = {commit: Path(folder) for commit, folder in args.htfllib_tree}
    for flag, root in [
        ("--htfllib", Path(args.htfllib)),
        *(("--htfllib-tree", t) for t in trees.values()),
    ]:
        if not (root / "system" / "main.py").exists():
            parser.error(f"{flag} {root}: no system/main.py there (an HtFLlib checkout?)")
    for label in args.methods:
        if label in HTFLLIB_AT and HTFLLIB_AT[label] not in trees:
            commit = HTFLLIB_AT[label]
            parser.error(
                f"row {label!r} runs HtFLlib at {commit}: pass --htfllib-tree {commit} DIR "
                f"(e.g. git -C <HtFLlib clone> worktree add DIR {commit}), or leave the row out"
            )
    torch.set_num_threads(args.threads)
    work = Path(args.work)
    (work / "logs").mkdir(parents=True, exist_ok=True)
    store = work / "runs"

    dataset = load_dataset("cifar10", args.data)
    base = base_config(args)
    name = f"Cifar10_fedtsp_frac{args.fraction:g}"
    split = Path(args.htfllib) / "dataset" / name
    export_split(base, dataset, split)
    for root in trees.values():
        export_split(base, dataset, root / "dataset" / name)
    results: dict[str, Any] = {
        "what": "best accuracy over R + 1 evaluations (%), mean ± sample std over seeds",
        "setting": {
            "dataset": "cifar10",
            "data_checksum": dataset.checksum,
            "alpha": 0.1,
            "num_clients": 20,
            "fraction": args.fraction,
            "family": f"htfe2 = HtFLlib {HTFLLIB_FAMILY}",
            "rounds": args.rounds,
            "local_epochs": 1,
            "batch_size": 100,
            "lr": 0.01,
            "protocol": args.protocol,
            "batch_order": base.batch_order,
            "client_init": base.client_init,
            "undersized_clients": base.undersized_clients,
            "seeds": args.seeds,
            "threads": args.threads,
        },
        "code_version": code_version(),
        "htfllib": args.htfllib_version or _htfllib_version(Path(args.htfllib)),
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
        "target": "|difference| <= max(1.5, 2 x the larger std)",
        "departures": {k: v for k, v in DEPARTURES.items() if k in args.methods},
        "methods": {},
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    for label in args.methods:
        algorithm, options, method_args = METHODS[label]
        ours: dict[str, list] = {
            "best_acc": [],
            "s_per_round": [],
            "keys": [],
            "commits": [],  # fedtsp code of each run (a stored run keeps the code it ran)
            "undersized": [],
        }
        theirs: dict[str, list] = {"best_acc": [], "s_per_round": [], "errors": []}
        for seed in args.seeds:
            start = time.perf_counter()
            config = base.replace(algorithm=algorithm, algo_options=options, seed=seed)
            mine = run_ours(config, dataset, store)
            check_same_split(split, mine.pop("record"))
            ours["best_acc"].append(mine["best_acc"])
            ours["s_per_round"].append(mine["s_per_round"])
            ours["undersized"].append(mine["undersized"])
            ours["keys"].append(mine["key"])
            ours["commits"].append(mine["commit"])
            root = trees[HTFLLIB_AT[label]] if label in HTFLLIB_AT else Path(args.htfllib)
            log = work / "logs" / f"{label.replace(', ', '-').replace(' ', '-')}-seed{seed}.log"
            other = run_htfllib(args, root, name, method_args, seed, log)
            if "error" in other:
                theirs["errors"].append(other["error"])
            else:
                theirs["best_acc"].append(other["best_acc"])
                theirs["s_per_round"].append(other["s_per_round"])
            print(
                f"{label} seed {seed}: fedtsp {mine['best_acc']:.2f} / HtFLlib "
                f"{other.get('best_acc', float('nan')):.2f} ({time.perf_counter() - start:.0f} s)",
                flush=True,
            )
        res: dict[str, Any] = {"ours": ours, "htfllib": theirs}
        if label in HTFLLIB_AT:
            res["htfllib_commit"] = HTFLLIB_AT[label]
        ours["s_per_round"] = statistics.fmean(ours["s_per_round"])
        if theirs["best_acc"]:
            (m1, s1), (m2, s2) = (
                (s.mean, s.std) for s in map(summarize, (ours["best_acc"], theirs["best_acc"]))
            )
            spread = max(s for s in (s1, s2) if s == s) if len(args.seeds) > 1 else 0.0
            res["difference"] = m1 - m2
            res["tolerance"] = max(1.5, 2 * spread)
            res["within"] = abs(m1 - m2) <= res["tolerance"]
            theirs["s_per_round"] = statistics.fmean(theirs["s_per_round"])
        results["methods"][label] = res
        out.write_text(json.dumps(results, indent=2) + "\n")  # after every method: resumable
        out.with_suffix(".md").write_text(table(results))
    print(table(results))
    measured = {
        name: json.loads(results_file(out.parent, name).read_text())
        for name in PROTOCOLS
        if results_file(out.parent, name).exists()
    }
    if len(measured) > 1 and "htfllib" in measured:
        (out.parent / "htfllib_side_by_side_protocols.md").write_text(protocol_table(measured))
    print(f"wrote {portable_path(out)} and {portable_path(out.with_suffix('.md'))}")
    return 0


def _htfllib_version(root: Path) -> str:
    head = subprocess.run(
        ["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    )
    return head.stdout.strip() or "unknown (not a git checkout)"


if __name__ == "__main__":
    raise SystemExit(main())

"""The project's benchmark: model training speed and the simulator's own overhead.

    python benchmarks/bench.py                      # models, round and server
    python benchmarks/bench.py --part models --families htfe-cpu htfe2
    python benchmarks/bench.py --part round --data ../shared/data/cifar10-jpg.tar.gz
    python benchmarks/bench.py --part server
    python benchmarks/bench.py --part engines --data ../shared/data/cifar10-jpg.tar.gz
    python benchmarks/bench.py --part workers
    python benchmarks/bench.py --part isa --data ../shared/data/cifar10-jpg.tar.gz

Part "models": training images/s of every architecture of the chosen families (batch 100,
32x32, forward + backward + SGD step, fp32, the machine's default thread count), with
and without 1x1-output convolutions as one matrix product (``models.point_conv``), on
inputs in the layout the simulator feeds them (``--layout``; auto: channels-last on CPU,
NCHW on CUDA; ``--device cuda``: on the GPU).
Part "round": one 20-client CIFAR-10 round of the real simulator, split into its phases;
the overhead is the round's wall time minus the time spent inside model forward /
backward / optimiser calls and the server step.
Part "server": one server step of the algorithms whose server does real work (FedTGP's
prototype training, FedTSP's prompt tuning with the long descriptions) on CIFAR-100-shaped
uploads from 20 clients holding ~20 classes each, at the cpu profile's settings.
Part "engines": the same small CIFAR-10 run (one thread per process) on the in-process
simulator, on Flower's simulation engine and as Flower processes on 127.0.0.1: wall time
and the largest per-round accuracy difference from the simulator (needs fedtsp[flower]).
Part "workers": NumPy work inside the batch runner's worker processes, two side by side as
`fedtsp reproduce` runs them: AlignFed's anchor construction for 100 classes (its set-up on
CIFAR-100), with the workers' threads limited for torch only (as before 5db2408) and for
every thread pool (``core.threads.single_thread_worker``).
Part "isa": what verifiability costs: training images/s of each htfe-cpu architecture and
one evidence round (CIFAR-10 Dir(0.1), 20 clients on a fifth of the images, htfe-cpu,
FedTSP, 5 local epochs), one thread, with the machine's own kernels and with the AVX2 pins
(fedtsp.core.isa), each in a fresh process started with its setting, side by side in one run.

Each part writes ``bench_<part>.json`` (figures, setting, command, code version, machine
facts) and ``bench_<part>.md`` (the table the README shows) to ``--out-dir``.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import torch
from facts import machine_facts, write_result

from fedtsp.core import isa
from fedtsp.core.config import RunConfig
from fedtsp.core.results import code_version
from fedtsp.data import LAYOUTS, device_images
from fedtsp.engine.simulation import run_experiment
from fedtsp.models.families import build_model, count_parameters, resolve_family
from fedtsp.models.point_conv import use_point_convs

RESULTS = Path(__file__).resolve().parent / "results"


def train_speed(
    arch: str,
    batch: int,
    steps: int,
    channels_last: bool | None,
    device: str,
    warmup: int = 2,
    precision: str = "fp32",
    point_convs: bool = True,
) -> float:
    """Training images/s: forward + backward + SGD step at ``batch`` on 32x32 inputs.
    ``point_convs=False``: with plain ``nn.Conv2d`` (before ``models.point_conv``)."""
    model = use_point_convs(build_model(arch, num_classes=10, feature_dim=512), point_convs)
    model = model.to(device)
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    images = torch.randint(0, 256, (batch, 3, 32, 32), dtype=torch.uint8)
    x = device_images(images, device, channels_last)  # the layout the simulator trains on
    y = torch.randint(0, 10, (batch,), device=device)
    loss_fn = torch.nn.CrossEntropyLoss()
    for i in range(warmup + steps):
        if i == warmup:
            _sync(device)
            start = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast(x.device.type, torch.bfloat16, enabled=precision == "bf16"):
            loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
    _sync(device)
    return batch * steps / (time.perf_counter() - start)


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)


def bench_models(
    families: list[str], batch: int, seconds: float, channels_last: bool | None, device: str
) -> tuple[dict[str, Any], str]:
    """Training images/s of each architecture, with and without ``models.point_conv``."""
    archs = list(dict.fromkeys(a for f in families for a in resolve_family(f)))
    if channels_last is None:  # what device_images picks
        channels_last = torch.device(device).type == "cpu"
    layout = "channels-last" if channels_last else "NCHW"
    rows = {}
    for arch in archs:
        probe = train_speed(arch, batch, 1, channels_last, device, warmup=1)  # sizes the run
        steps = max(3, int(seconds * probe / batch))
        speeds = {
            plain: train_speed(arch, batch, steps, channels_last, device, point_convs=not plain)
            for plain in (True, False)
        }
        params = count_parameters(build_model(arch, num_classes=10, feature_dim=512)) / 1e6
        rows[arch] = {
            "parameters_m": params,
            "plain_convs": speeds[True],
            "images_s": speeds[False],
        }
        print(f"{arch}: {speeds[False]:,.0f} images/s ({speeds[True]:,.0f} plain)", flush=True)
    lines = [
        f"Training images/s (batch {batch}, 32x32, fp32, {layout}, {device}); plain: every "
        "convolution through torch, before 1x1-output convolutions became one matrix product",
        "",
        "| model | parameters (M) | plain | images/s | speed-up |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    lines += [
        f"| {a} | {r['parameters_m']:.2f} | {r['plain_convs']:,.0f} | {r['images_s']:,.0f} "
        f"| {r['images_s'] / r['plain_convs']:.2f}x |"
        for a, r in rows.items()
    ]
    setting = {"families": families, "batch": batch, "layout": layout, "precision": "fp32"}
    return {"setting": setting, "models": rows}, "\n".join(lines)


def bench_round(
    data: str | None, family: str, fraction: float, algorithm: str, epochs: int
) -> tuple[dict[str, Any], str]:
    """One 20-client round of the simulator by phase, and its overhead."""
    config = RunConfig(
        dataset="cifar10",
        alpha=0.1,
        num_clients=20,
        fraction=fraction,
        family=family,
        algorithm=algorithm,
        rounds=1,
        local_epochs=epochs,
    )
    with tempfile.TemporaryDirectory() as out:
        record = run_experiment(config, data=data, out=out, progress=False)
    row = record["history"][0]
    t = row["timings"]
    wall = row["wall"]  # the checkpoint, if one is due, comes after the round's clock stops
    overhead = wall - t["model"] - t["server"]
    n_train = sum(record["partition"]["train_sizes"])
    lines = [
        f"One round: CIFAR-10 Dir(0.1), 20 clients, {family}, {algorithm}, fraction "
        f"{fraction} ({n_train} train images), {epochs} local epoch(s)",
        "",
        "| phase | seconds | share |",
        "| --- | ---: | ---: |",
    ]
    lines += [
        f"| {name} | {t[name]:.2f} | {t[name] / wall:.1%} |"
        for name in ("train", "evaluate", "upload", "server", "broadcast", "checkpoint")
    ]
    lines += [
        f"| **round wall** (without the checkpoint) | {wall:.2f} | 100% |",
        f"| inside model forward/backward/step | {t['model']:.2f} | {t['model'] / wall:.1%} |",
        f"| simulator overhead (wall - model - server) | {overhead:.2f} | {overhead / wall:.1%} |",
    ]
    setting = {"family": family, "fraction": fraction, "algorithm": algorithm, "epochs": epochs}
    payload = {"setting": setting, "timings": t, "wall": wall, "overhead": overhead}
    return payload, "\n".join(lines)


# The cpu profile's server settings (profiles.toml): FedTSP with E_s = 1 on the long
# descriptions; FedTGP at its defaults (100 server epochs).
SERVER_CASES = {"fedtgp": {}, "fedtsp": {"prompts": "long", "server_epochs": 1}}


def bench_server(algorithms: list[str], clients: int, steps: int) -> tuple[dict[str, Any], str]:
    from fedtsp.algorithms import get_algorithm, resolve_options
    from fedtsp.algorithms.base import RunContext
    from fedtsp.data.registry import dataset_info

    classes = list(dataset_info("cifar100").classes)
    rows = {}
    for name in algorithms:
        options = SERVER_CASES.get(name, {})
        cls = get_algorithm(name)
        opts = resolve_options(name, options)
        dim = cls.required_feature_dim(opts) or 512  # 512: the image models' default width
        ctx = RunContext("cifar100", classes, dim, clients, steps, torch.device("cpu"), 0)
        server = cls.Server(opts, ctx)
        server.setup([], {})
        gen = torch.Generator().manual_seed(0)
        uploads: dict[int, dict[str, torch.Tensor]] = {}
        for _ in range(clients):  # ~20 held classes per client, as under Dir(0.1)
            counts = torch.zeros(len(classes), dtype=torch.long)
            held = torch.randperm(len(classes), generator=gen)[:20]
            counts[held] = torch.randint(1, 60, (20,), generator=gen)
            means = torch.randn(len(classes), dim, generator=gen) * (counts > 0).unsqueeze(1)
            uploads[len(uploads)] = (
                {"protos": means[counts > 0], "present": counts > 0}
                if name == "fedtgp"
                else {"protos": means, "counts": counts}
            )
        server.aggregate(1, uploads)  # warm-up
        server.configure(2, list(uploads))
        start = time.perf_counter()
        for r in range(steps):
            server.aggregate(r + 2, uploads)
            server.configure(r + 3, list(uploads))
        rows[name] = {"options": options, "seconds": (time.perf_counter() - start) / steps}
        print(f"{name}: {rows[name]['seconds']:.2f} s / step", flush=True)
    lines = [
        f"One server step (CIFAR-100-shaped uploads, {clients} clients holding ~20 classes)",
        "",
        "| algorithm | options | seconds / step |",
        "| --- | --- | ---: |",
    ]
    lines += [
        f"| {n} | {r['options'] or 'defaults'} | {r['seconds']:.2f} |" for n, r in rows.items()
    ]
    return {"setting": {"clients": clients, "steps": steps}, "algorithms": rows}, "\n".join(lines)


def _torch_only_worker() -> None:
    torch.set_num_threads(1)  # the runner's worker initialiser before 5db2408


def _anchor_seconds(iters: int) -> float:
    from fedtsp.algorithms.prototypes import uniform_anchors

    torch.manual_seed(0)
    start = time.perf_counter()
    uniform_anchors(100, 512, iters, lr=0.1, tau=0.5)
    return time.perf_counter() - start


def bench_workers(workers: int, iters: int) -> tuple[dict[str, Any], str]:
    from fedtsp.algorithms.prototypes import ANCHOR_ITERS
    from fedtsp.core.threads import single_thread_worker

    run_iters = ANCHOR_ITERS  # what one AlignFed run does in its set-up
    cases = {"torch only (before)": _torch_only_worker, "every pool (now)": single_thread_worker}
    ctx = multiprocessing.get_context("spawn")
    rows = {}
    for label, initializer in cases.items():
        with ProcessPoolExecutor(workers, mp_context=ctx, initializer=initializer) as pool:
            list(pool.map(_anchor_seconds, [10] * workers))  # start the workers, load modules
            seconds = list(pool.map(_anchor_seconds, [iters] * workers))
        per_run = statistics.median(seconds) * run_iters / iters
        rows[label] = {"seconds": seconds, "seconds_per_run": per_run}
        print(f"{label}: {per_run:.1f} s per run", flush=True)
    before, now = (r["seconds_per_run"] for r in rows.values())
    lines = [
        f"AlignFed's anchor set-up for 100 classes (d = 512, {run_iters:,} steps, timed on "
        f"{iters:,} and scaled) in {workers} worker processes side by side",
        "",
        "| worker threads limited for | seconds per run (median over workers) |",
        "| --- | ---: |",
    ]
    lines += [f"| {label} | {r['seconds_per_run']:.1f} |" for label, r in rows.items()]
    lines += ["", f"Speed-up: {before / now:.1f}x."]
    setting = {"workers": workers, "timed_steps": iters, "steps_per_run": run_iters}
    return {"setting": setting, "cases": rows, "speedup": before / now}, "\n".join(lines)


ENGINES = ("simulator", "flower-sim", "flower-processes")


def bench_engines(
    data: str | None, family: str, algorithms: list[str], clients: int, rounds: int
) -> tuple[dict[str, Any], str]:
    from fedtsp.data import load_dataset
    from fedtsp.engine.flower.launch import run_flower

    torch.set_num_threads(1)  # every Flower process then gets one thread too (flower_env)
    dataset = load_dataset("cifar10", data)
    rows = []
    for algorithm in algorithms:
        config = RunConfig(
            dataset="cifar10",
            alpha=0.1,
            num_clients=clients,
            fraction=0.1,
            family=family,
            algorithm=algorithm,
            rounds=rounds,
            local_epochs=1,
            global_eval_every=0,
        )
        reference = None
        for engine in ENGINES:
            with tempfile.TemporaryDirectory() as out:
                start = time.perf_counter()
                if engine == "simulator":
                    record = run_experiment(config, dataset=dataset, out=out, progress=False)
                else:
                    record = run_flower(config, engine=engine, dataset=dataset, out=out)
                wall = time.perf_counter() - start
            accs = [row["acc"] for row in record["history"]]
            reference = reference or accs
            diff = max(abs(a - b) for a, b in zip(accs, reference, strict=True)) * 100
            best = record["summary"]["best_acc"] * 100
            rows.append({"algorithm": algorithm, "engine": engine, "wall": wall, "best": best})
            rows[-1]["max_diff_points"] = diff
            print(f"{algorithm} {engine}: {wall:.1f} s", flush=True)
    lines = [
        f"One run on each engine: CIFAR-10 Dir(0.1), {clients} clients, fraction 0.1, "
        f"{family}, {rounds} rounds x 1 local epoch, seed 0, one thread per process",
        "",
        "| algorithm | engine | wall (s) | s / round | best acc (%) "
        "| largest per-round accuracy difference vs simulator (points) |",
        "| --- | --- | ---: | ---: | ---: | ---: |",
    ]
    lines += [
        f"| {r['algorithm']} | {r['engine']} | {r['wall']:.1f} | {r['wall'] / rounds:.2f} "
        f"| {r['best']:.2f} | {r['max_diff_points']:.2f} |"
        for r in rows
    ]
    setting = {"family": family, "clients": clients, "rounds": rounds}
    return {"setting": setting, "runs": rows}, "\n".join(lines)


ISA_FAMILY = "htfe-cpu"


def isa_level_speeds(data: str | None, batch: int, seconds: float) -> dict[str, Any]:
    """This process's kernels, the htfe-cpu models' training images/s and one evidence
    round's seconds, at one thread (the part "isa" runs it once per setting)."""
    torch.set_num_threads(1)
    models = {}
    for arch in resolve_family(ISA_FAMILY):
        probe = train_speed(arch, batch, 1, True, "cpu", warmup=1)
        models[arch] = train_speed(arch, batch, max(3, int(seconds * probe / batch)), True, "cpu")
    payload, _ = bench_round(data, ISA_FAMILY, 0.2, "fedtsp", 5)
    aten = str(torch.backends.cpu.get_cpu_capability())
    return {"aten": aten, "isa": isa.describe(), "models": models, "round_s": payload["wall"]}


def _median_speeds(measured: list[dict[str, Any]]) -> dict[str, Any]:
    """The median of each figure over repeated processes of one setting."""
    models = {a: statistics.median(m["models"][a] for m in measured) for a in measured[0]["models"]}
    round_s = statistics.median(m["round_s"] for m in measured)
    return measured[0] | {"models": models, "round_s": round_s, "repeats": len(measured)}


def bench_isa(
    data: str | None, batch: int, seconds: float, repeats: int
) -> tuple[dict[str, Any], str]:
    """Native against pinned kernels, each measured in processes started with its setting
    (the kernels are chosen when torch first computes, so one process cannot measure both);
    the median of ``repeats`` processes per setting."""
    runs: dict[str, list[dict[str, Any]]] = {"native": [], "avx2": []}
    for _ in range(repeats):  # alternating, so a drift of the machine hits both alike
        for level, measured in runs.items():
            # set before this script imports torch (it does, before fedtsp)
            start = os.environ | isa.level_variables(level)
            env = {k: v for k, v in start.items() if v is not None}
            argv = [sys.executable, __file__, "--part", "isa-level", "--batch", str(batch)]
            argv += ["--seconds", str(seconds)] + (["--data", data] if data else [])
            done = subprocess.run(argv, env=env, capture_output=True, text=True, check=True)
            measured.append(json.loads(done.stdout.strip().splitlines()[-1]))
            print(f"{level}: {measured[-1]['aten']} kernels, {measured[-1]}", flush=True)
    levels = {level: _median_speeds(measured) for level, measured in runs.items()}
    native, pinned = levels["native"], levels["avx2"]
    lines = [
        f"Training images/s (batch {batch}, 32x32, fp32, channels-last, 1 thread) and one "
        "evidence round (CIFAR-10 Dir(0.1), 20 clients on a fifth of the images, htfe-cpu, "
        "FedTSP, 5 local epochs), the machine's own kernels "
        f"({native['aten']}) against the AVX2 pins ({pinned['aten']}); median of {repeats} "
        "fresh processes per setting, run alternately",
        "",
        "| what | native | pinned (AVX2) | pinned / native |",
        "| --- | ---: | ---: | ---: |",
    ]
    for arch, speed in native["models"].items():
        other = pinned["models"][arch]
        lines.append(f"| {arch} (images/s) | {speed:,.0f} | {other:,.0f} | {other / speed:.2f} |")
    n, p = native["round_s"], pinned["round_s"]
    lines.append(f"| evidence round (s) | {n:.2f} | {p:.2f} | {p / n:.2f} |")
    setting = {"family": ISA_FAMILY, "batch": batch, "threads": 1, "round": "fedtsp, 5 epochs"}
    setting["repeats"] = repeats
    return {"setting": setting, "levels": levels}, "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--part",
        choices=["models", "round", "server", "engines", "workers", "isa", "isa-level", "all"],
        default="all",
    )
    parser.add_argument("--families", nargs="+", default=["htfe-cpu", "htfe2", "htfe9"])
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--device", default="cpu", help="models part: cpu or cuda")
    parser.add_argument(
        "--layout", choices=list(LAYOUTS), default="auto", help="models part: image layout"
    )
    parser.add_argument("--seconds", type=float, default=3.0, help="timed seconds per model")
    parser.add_argument("--data", default=None, help="CIFAR-10 source (else $FEDTSP_DATA / cache)")
    parser.add_argument("--family", default="htfe-cpu", help="family for the round benchmark")
    parser.add_argument("--fraction", type=float, default=0.2)
    parser.add_argument("--algorithm", default="fedtsp")
    parser.add_argument("--local-epochs", type=int, default=1)
    parser.add_argument("--server-algorithms", nargs="+", default=list(SERVER_CASES))
    parser.add_argument("--server-steps", type=int, default=3)
    parser.add_argument("--engine-algorithms", nargs="+", default=["fedproto", "fedtsp"])
    parser.add_argument("--engine-clients", type=int, default=5)
    parser.add_argument("--engine-rounds", type=int, default=10)
    parser.add_argument("--workers", type=int, default=2, help="workers part: processes")
    parser.add_argument("--repeats", type=int, default=3, help="isa part: processes per setting")
    parser.add_argument("--anchor-steps", type=int, default=5000, help="workers part: timed")
    parser.add_argument(
        "--out-dir",
        default=str(RESULTS),
        help="where bench_<part>.json and .md go (default: benchmarks/results)",
    )
    args = parser.parse_args()
    parts = {
        "models": lambda: bench_models(
            args.families, args.batch, args.seconds, LAYOUTS[args.layout], args.device
        ),
        "round": lambda: bench_round(
            args.data, args.family, args.fraction, args.algorithm, args.local_epochs
        ),
        "server": lambda: bench_server(args.server_algorithms, 20, args.server_steps),
        # not in "all": needs the Flower extra and starts processes
        "engines": lambda: bench_engines(
            args.data, args.family, args.engine_algorithms, args.engine_clients, args.engine_rounds
        ),
        "workers": lambda: bench_workers(args.workers, args.anchor_steps),
        "isa": lambda: bench_isa(args.data, args.batch, args.seconds, args.repeats),
    }
    if args.part == "isa-level":  # one side of part "isa", in the process it started
        print(json.dumps(isa_level_speeds(args.data, args.batch, args.seconds)))
        return
    chosen = ["models", "round", "server"] if args.part == "all" else [args.part]
    code = code_version()  # what is measured: the code as it is now
    for part in chosen:
        payload, markdown = parts[part]()
        payload["machine"] = machine_facts(args.device if part == "models" else "cpu")
        out = Path(args.out_dir) / f"bench_{part}.json"
        write_result(out, payload, markdown, code)
        print(out.with_suffix(".md").read_text())


if __name__ == "__main__":
    main()

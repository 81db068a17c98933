"""The FMCL benchmark: clustered-FL methods on populations with known client groups.

Every (population, method, seed) is an ordinary federated run (`RunConfig.population`,
setting ``pfl``, one architecture for every client) of a clustered algorithm on the one
engine: ``fmcl``, ``pacfl``, ``ifca`` and ``cfl`` (`fedtsp.algorithms`), and the ``clusters``
algorithm for FedAvg (one cluster), Local (every client alone) and the oracle (the planted
groups). `benchmark_specs` plans them (the batch runner and notebook 08 share it through
`fedtsp.paper.notebook_runs.fmcl_benchmark`), the run store keeps their records, `benchmark_row` reads one
back and `summarize_benchmark` gives one row per method: mean +- std over seeds and the
clustering's stability across seeds (mean pairwise adjusted Rand index between the
partitions found with different seeds on the same population). IFCA needs K; unless
``method_options["ifca"]["num_clusters"]`` is set it gets the true number of groups (an
advantage the automatic methods do not have; it is in the run's options). PACFL's beta is
the one tuned per population on seeds no table uses (`pacfl_beta`), where one was tuned.

Metrics per run: best-round and final accuracy (sample-weighted over all clients' test
samples) and final unweighted mean client accuracy; number of clusters; ARI and NMI of the
found clusters against the true groups; bytes per client over the whole run, set-up
included (FMCL's signatures and PACFL's subspaces travel in set-up, with every cluster's
start); wall seconds (all rounds) and the set-up's seconds, where the one-shot methods embed
and cluster (``cluster_seconds``).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from sklearn.metrics import adjusted_rand_score, normalized_mutual_info_score

from fedtsp.core.config import RunConfig
from fedtsp.data import ImageDataset
from fedtsp.data.populations import POPULATIONS
from fedtsp.engine.runspec import check_run
from fedtsp.paper.experiments import DataSource, RunSpec, partition_seed_of, run_all
from fedtsp.paper.fmcl.pacfl_beta import chosen_beta
from fedtsp.paper.statistics import cell, summarize

__all__ = [
    "METHODS",
    "POPULATIONS",
    "benchmark_config",
    "benchmark_row",
    "benchmark_specs",
    "is_benchmark_record",
    "run_benchmark",
    "summarize_benchmark",
]

# Benchmark method -> (algorithm, its options).
METHODS: dict[str, tuple[str, dict[str, Any]]] = {
    "fmcl": ("fmcl", {}),
    "fedavg": ("clusters", {"clusters": "one"}),
    "local": ("clusters", {"clusters": "each"}),
    "ifca": ("ifca", {}),
    "cfl": ("cfl", {}),
    "pacfl": ("pacfl", {}),
    "oracle": ("clusters", {"clusters": "truth"}),
}


def benchmark_config(
    population: str,
    method: str,
    seed: int,
    *,
    num_clients: int = 20,
    fraction: float = 0.1,
    rounds: int = 20,
    local_epochs: int = 1,
    arch: str = "fedavgcnn_s",
    batch_size: int = 32,
    lr: float = 0.01,
    encoder: str = "efficientnet-lite0",
    encoder_input_size: int | None = 96,
    method_options: dict[str, dict[str, Any]] | None = None,
    device: str = "cpu",
    partition_seed: int | str = 1,
) -> RunConfig:
    """The run of ``method`` on ``population`` with one seed, checked (one clear error).

    ``partition_seed``: fixed (1, the default) or ``"seed"`` (each seed its own clients)."""
    if population not in POPULATIONS:
        names = ", ".join(POPULATIONS)
        raise ValueError(f"unknown population {population!r}; choose one of {names}")
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; choose from {', '.join(METHODS)}")
    algorithm, options = METHODS[method]
    spec = POPULATIONS[population]
    options = dict(options)
    if method == "fmcl":
        options |= {"encoder": encoder, "input_size": encoder_input_size}
    if method == "ifca":
        options["num_clusters"] = spec.groups
    if method == "pacfl" and chosen_beta(population) is not None:
        options["distance_threshold"] = chosen_beta(population)  # tuned on seeds kept out
    options |= (method_options or {}).get(method, {})
    config = RunConfig(
        dataset=spec.datasets[0],
        population=population,
        num_clients=num_clients,
        fraction=fraction,
        setting="pfl",
        family=f"homo-{arch}",
        algorithm=algorithm,
        algo_options=options,
        rounds=rounds,
        local_epochs=local_epochs,
        batch_size=batch_size,
        lr=lr,
        seed=seed,
        partition_seed=partition_seed_of(partition_seed, seed),
        client_init="shared",  # every client starts from the same weights
        device=device,
    )
    return check_run(config)


def benchmark_specs(
    populations: Sequence[str], methods: Sequence[str], seeds: Sequence[int], **fields: Any
) -> list[RunSpec]:
    """Every (population, method, seed) as a run spec labelled with population and method."""
    extra = set(fields.get("method_options") or {}) - set(methods)
    if extra:
        raise ValueError(f"method_options given for methods not run: {sorted(extra)}")
    return [
        RunSpec(benchmark_config(p, m, s, **fields), {"population": p, "method": m})
        for p, m, s in itertools.product(populations, methods, seeds)
    ]


def is_benchmark_record(record: dict[str, Any]) -> bool:
    """A run on a population (the benchmark's kind of run)."""
    return record.get("config", {}).get("population") is not None


def method_label(config: dict[str, Any]) -> str:
    """The benchmark method a run's algorithm and options stand for."""
    if config["algorithm"] == "clusters":
        how = config["algo_options"].get("clusters", "one")
        return {"one": "fedavg", "each": "local", "truth": "oracle"}[how]
    return config["algorithm"]


def benchmark_row(record: dict[str, Any]) -> dict[str, Any]:
    """One benchmark run's record as a flat row (what `summarize_benchmark` reads)."""
    s, config, history = record["summary"], record["config"], record["history"]
    truth = record["partition"]["groups"]
    found = (record.get("server") or {}).get("assignment") or [0] * len(truth)
    setup = record.get("setup", {})
    return {
        "population": config["population"],
        "method": method_label(config),
        "seed": config["seed"],
        "num_clients": config["num_clients"],
        "true_groups": len(set(truth)),
        "num_clusters": len(set(found)),
        "ari": float(adjusted_rand_score(truth, found)),
        "nmi": float(normalized_mutual_info_score(truth, found)),
        "best_acc": s["best_acc"],
        "final_acc": s["final_acc"],
        # whether the accuracy had reached its plateau (the claims say so where it had not)
        "converged": s["converged"],
        "rounds": config["rounds"],
        "final_mean_client_acc": float(np.mean(history[-1]["client_acc"])),
        "bytes_per_client": setup.get("bytes_up_per_client", 0.0)
        + setup.get("bytes_down", 0.0)
        + sum(
            r.get("bytes_up_per_client", 0.0) + r.get("bytes_down_per_client", 0.0) for r in history
        ),
        "cluster_seconds": setup.get("seconds", 0.0),
        "wall_seconds": record["timings"]["rounds_wall"],
        "assignment": found,
        "key": record["key"],
        "cache_hit": record.get("cache_hit", False),
    }


def run_benchmark(
    population: str = "label-groups",
    methods: Sequence[str] = ("fmcl", "fedavg", "local", "ifca", "cfl", "pacfl"),
    seeds: Sequence[int] = (0, 1, 2),
    *,
    out: str | Path = "results/fmcl/runs",
    data: str | None = "auto",
    datasets: dict[str, ImageDataset] | None = None,
    workers: int = 1,
    progress: bool = True,
    **fields: Any,
) -> pd.DataFrame:
    """Run (or reuse from the store ``out``) every (method, seed) on one population; one
    DataFrame row per run. ``fields``: `benchmark_config`'s keywords (size, rounds, model,
    encoder, ``method_options``). ``datasets`` supplies loaded datasets by name (tests);
    the others come from ``data`` as in a profile. Every input is checked before any data
    is read.
    """
    specs = benchmark_specs([population], list(methods), list(seeds), **fields)
    source = DataSource(data, loaded=datasets)
    records = run_all(specs, source, out, workers=workers, progress=progress)
    return pd.DataFrame([benchmark_row(r) for r in records])


def _stability(assignments: Sequence[Sequence[int]]) -> float:
    pairs = list(itertools.combinations(assignments, 2))
    if not pairs:
        return float("nan")
    return float(np.mean([adjusted_rand_score(a, b) for a, b in pairs]))


def summarize_benchmark(df: pd.DataFrame) -> pd.DataFrame:
    """One row per (population, method): per metric the mean, sample std and 95 % interval
    over seeds (`statistics.summarize`; NaN spread for one seed), and clustering stability."""
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
            s = summarize(g[m])
            row |= {f"{m}_{k}": v for k, v in s.as_dict().items() if k != "n"}
        row["stability_ari"] = _stability(list(g["assignment"]))
        out.append(row)
    return pd.DataFrame(out)


def benchmark_table(summary: pd.DataFrame) -> pd.DataFrame:
    """The readable FMCL table from `summarize_benchmark`'s rows: mean ± std over seeds of
    accuracy (%), clusters, ARI and NMI, the stability across seeds, MiB per client, wall."""

    def spread(name: str, scale: float = 1.0, decimals: int = 2) -> list[str]:
        return [
            cell(scale * r[f"{name}_mean"], scale * r[f"{name}_std"], r["seeds"], decimals)
            for _, r in summary.iterrows()
        ]

    return pd.DataFrame(
        {
            "population": summary["population"],
            "method": summary["method"],
            "accuracy (%)": spread("best_acc", 100),
            "clusters": spread("num_clusters", decimals=1),
            "ARI": spread("ari"),
            "NMI": spread("nmi"),
            "stability (ARI across seeds)": summary["stability_ari"].round(2),
            "MiB per client": (summary["bytes_per_client_mean"] / 2**20).round(2),
            "wall (s)": summary["wall_seconds_mean"].round(0),
        }
    )

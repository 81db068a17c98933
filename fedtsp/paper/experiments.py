"""Run many experiments at once: data sources, run specs, and a runner over the store.

The notebooks and the batch runner describe what they need as `RunSpec`s (labels for the
tables + a `RunConfig`); `run_all` serves each one from the run store or has an executor
(`fedtsp.paper.executors`: this machine's processes, or a Ray cluster) run it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from math import nan
from pathlib import Path
from typing import Any

import pandas as pd

from fedtsp.algorithms import resolve_options
from fedtsp.core.config import ConfigError, RunConfig, stable_hash
from fedtsp.core.environment import data_path
from fedtsp.core.paths import REPO_ROOT
from fedtsp.core.results import RunStore, converged
from fedtsp.data import (
    DatasetNotFoundError,
    ImageDataset,
    dataset_info,
    load_dataset,
    synthetic_dataset,
)
from fedtsp.engine.runspec import check_run, data_names
from fedtsp.engine.simulation import run_key
from fedtsp.paper.executors import BatchProgress, Executor, LocalExecutor, describe_run
from fedtsp.paper.floors import record_label_prior
from fedtsp.paper.profiles import method_specs
from fedtsp.paper.system import dataset_hint


class RunsFailed(RuntimeError):
    """Some runs of a batch failed; the others finished and are in the store."""


def resolve_data(data: str | None) -> str | None:
    """A profile's `data` value as given to `load_dataset` ("synthetic" stays as is).

    "auto": $FEDTSP_DATA, else `../shared/data` beside the repository if it exists, else
    None (the cache, then a torchvision download).
    """
    if data in (None, "", "auto"):
        env = data_path()
        if env is not None:
            return str(env)
        shared = REPO_ROOT.parent / "shared" / "data"
        return str(shared) if shared.is_dir() else None
    return data


class DataSource:
    """Loads each dataset once, from a profile's `data` value."""

    def __init__(
        self,
        data: str | None = "auto",
        synthetic_per_class: int = 12,
        loaded: dict[str, ImageDataset] | None = None,
    ) -> None:
        # "auto" also falls back to the default places (e.g. Fashion-MNIST's Debian folder)
        # for a dataset the chosen folder does not hold. `loaded`: datasets already in memory.
        self.auto = data in (None, "", "auto")
        self.requested = data  # as given: a worker process rebuilds the same source from it
        self.data = resolve_data(data)
        self.synthetic_per_class = synthetic_per_class
        self._loaded: dict[str, ImageDataset] = dict(loaded or {})

    @property
    def synthetic(self) -> bool:
        return self.data == "synthetic"

    def get(self, name: str) -> ImageDataset:
        if name not in self._loaded:
            if self.synthetic:
                self._loaded[name] = synthetic_dataset(name, per_class=self.synthetic_per_class)
            else:
                try:
                    self._loaded[name] = load_dataset(name, self.data, download=False)
                except DatasetNotFoundError:
                    if not (self.auto and self.data is not None):
                        raise
                    self._loaded[name] = load_dataset(name, None, download=False)
        return self._loaded[name]

    def datasets(self, config: RunConfig) -> dict[str, ImageDataset]:
        """Every dataset a run reads (its dataset, or its population's), by name."""
        return {name: self.get(name) for name in data_names(config)}

    def _load_error(self, name: str) -> DatasetNotFoundError | None:
        try:
            self.get(name)
        except DatasetNotFoundError as exc:
            return exc
        return None

    def missing_reason(self, name: str) -> str | None:
        """None if `name` loads; otherwise one sentence saying why it is skipped."""
        exc = self._load_error(name)
        return None if exc is None else f"{name} skipped: no offline copy here ({exc})"

    def split(self, names: list[str]) -> tuple[list[str], list[str]]:
        """(datasets that load, skip notes for the others)."""
        reasons = {name: self.missing_reason(name) for name in names}
        return [n for n, r in reasons.items() if r is None], [r for r in reasons.values() if r]

    def require(self, names: list[str], writer: Any, affects: str) -> list[str]:
        """The datasets of `names` that load; each other one is reported by `writer.skip`.

        `writer` is the notebook's `ResultsWriter`: a dataset its profile plans to leave out
        is listed as planned, any other makes the notebook's output partial.
        """
        available = []
        for name in names:
            exc = self._load_error(name)
            if exc is None:
                available.append(name)
            else:
                remedy = dataset_hint(name) or dataset_info(name).how_to_get
                writer.skip(name, affects, f"no copy found here ({exc})", remedy)
        return available


@dataclass(frozen=True)
class RunSpec:
    """One run, with the labels a table or figure files it under."""

    config: RunConfig
    labels: dict[str, Any] = field(default_factory=dict)


def method_config(
    base: dict[str, Any],
    method: str,
    method_options: dict[str, dict[str, Any]] | None = None,
    **fields: Any,
) -> RunConfig:
    """The RunConfig of method label `method` (see [methods] in profiles.toml) on `base`.

    `method_options` (algorithm name -> options, a profile's scale-down of e.g. server
    epochs) apply first; `algo_options` in `fields` (a notebook's own variation) last.
    """
    specs = method_specs()
    if method not in specs:
        raise ConfigError(f"unknown method label {method!r}; defined: {', '.join(specs)}")
    spec = dict(specs[method])
    algorithm = spec.pop("algorithm")
    if "setting" in spec:  # a RunConfig field, not an algorithm option
        fields.setdefault("setting", spec.pop("setting"))
    scale = (method_options or {}).get(algorithm, {})
    options = {**spec, **scale, **fields.pop("algo_options", {})}
    # Options left at their defaults are dropped, so that the same run spelt two ways (e.g.
    # "trainable_prompts": True given or not) has one key and is run once.
    defaults = vars(resolve_options(algorithm, {}))
    options = {k: v for k, v in options.items() if k not in defaults or defaults[k] != v}
    merged = {**base, **fields, "algorithm": algorithm, "algo_options": options}
    merged["partition_seed"] = partition_seed_of(
        merged.get("partition_seed", 1), merged.get("seed", 0)
    )
    return check_run(RunConfig.from_dict(merged), here=False)  # device: checked at the start


def config_hash_without(config: RunConfig, fields: tuple[str, ...]) -> str:
    """A stable hash of the config's fields other than `fields`."""
    return stable_hash({k: v for k, v in config.to_dict().items() if k not in fields})


def seed_group(config: RunConfig) -> str:
    """The run's group: its config without the seed and the partition seed (the runs a
    table cell averages over, and an analysis plan gives seeds to)."""
    return config_hash_without(config, ("seed", "partition_seed"))


def partition_seed_of(value: int | str, seed: int) -> int:
    """A profile's `partition_seed`: a fixed integer (the authors' protocol: 1 for every
    seed), or "seed" for a partition of each seed's own (its spread then includes it)."""
    if value == "seed":
        return int(seed)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f'partition_seed={value!r} is invalid; must be an integer or "seed"')
    return value


def run_all(
    specs: list[RunSpec],
    source: DataSource,
    store: str | Path,
    workers: int = 1,
    progress: bool = True,
    executor: Executor | None = None,
) -> list[dict[str, Any]]:
    """The record of every spec, in order: from the store, else run now (interrupted runs resume).

    The missing runs go to ``executor`` (default: `LocalExecutor(workers)`). Failed runs
    are reported together at the end (`RunsFailed`) after the others finished.
    """
    executor = LocalExecutor(workers) if executor is None else executor
    run_store = RunStore(store)
    keys = [run_key(s.config, source.datasets(s.config)) for s in specs]
    todo: dict[str, RunConfig] = {}
    for key, spec in zip(keys, specs, strict=True):
        if run_store.load(key) is None:
            todo.setdefault(key, spec.config)
    for config in todo.values():  # stored runs need no device; new ones fail here, not later
        check_run(config, here=executor.runs_here)
    errors: dict[str, str] = {}
    if todo:
        from fedtsp.paper.plan import run_estimates  # the plan imports this module

        estimates = run_estimates(todo, source, Path(store), executor.threads_per_run)
        bar = BatchProgress(estimates, show_bar=progress, parallel=executor.parallel_runs)
        bar.say(f"{len(set(keys)) - len(todo)} runs from the store, {len(todo)} to run")
        try:
            errors = executor.run(todo, source, Path(store), bar)
        finally:
            bar.close()
    if errors:
        lines = "\n".join(f"  {k}: {describe_run(todo[k])}: {v}" for k, v in errors.items())
        raise RunsFailed(f"{len(errors)} of {len(todo)} runs failed:\n{lines}")
    records = [run_store.load(key) for key in keys]
    for key, record in zip(keys, records, strict=True):
        record["cache_hit"] = key not in todo  # found in the store, not run now
    return records


def _setting_converged(record: dict[str, Any]) -> bool:
    """Whether Table 3's curve (the global model's, for gfl) reached a plateau."""
    key = "gfl_acc" if record["config"].get("setting") == "gfl" else "acc"
    return converged([r[key] for r in record["history"] if r.get(key) is not None])


def runs_table(specs: list[RunSpec], records: list[dict[str, Any]]) -> pd.DataFrame:
    """One row per run: its labels, seed, key and summary numbers (accuracies in %); with
    no runs (a notebook whose groups the analysis plan leaves out), an empty frame that
    still has the seed and key columns."""
    rows = []
    for spec, rec in zip(specs, records, strict=True):
        summary = rec["summary"]
        last = rec["history"][-1]
        trained = [r for r in rec["history"] if "bytes_up_per_client" in r]
        rows.append(
            {
                **spec.labels,
                "seed": rec["config"]["seed"],
                "key": rec["key"],
                "best_acc": 100 * summary["best_acc"],
                # the floors of its test splits (fedtsp.paper.floors) and its plateau
                "label_prior": record_label_prior(rec),
                "label_prior_top5": record_label_prior(rec, k=5),
                "converged": converged([r["acc"] for r in rec["history"]]),
                "setting_converged": _setting_converged(rec),
                "rounds": rec["config"]["rounds"],
                "last5_acc": 100 * summary["last5_mean_acc"],
                "best_top5": 100 * summary["best_top5"],
                "final_acc": 100 * summary["final_acc"],
                # Table 3's number: the global model (gfl) or the personalised models (pfl).
                "setting_acc": 100 * summary.get(f"best_{rec['config'].get('setting')}_acc", nan),
                "global_acc": 100 * last["global_acc"] if "global_acc" in last else nan,
                "wall_s": rec["timings"]["rounds_wall"],
                "kib_per_round": (
                    sum(r["bytes_up_per_client"] + r["bytes_down_per_client"] for r in trained)
                    / max(len(trained), 1)
                    / 1024
                ),
                "git_commit": (rec.get("git_commit") or "unknown")[:10],
                "data_source": rec["dataset"]["source"],
            }
        )
    return pd.DataFrame(rows) if rows else pd.DataFrame(columns=["seed", "key"])

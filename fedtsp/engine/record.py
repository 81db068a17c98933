"""The one run-record builder of federated runs, whatever engine ran them."""

from __future__ import annotations

import resource
import time
from typing import Any

import numpy as np
import torch

from fedtsp.core import isa
from fedtsp.core.config import RunConfig
from fedtsp.core.machine import cpu_class
from fedtsp.core.results import RECORD_VERSION, code_version, summarize_history

KIND = "federated"  # the "kind" of these records in a run store


def setting_summary(history: list[dict[str, Any]], setting: str) -> dict[str, Any]:
    """The Table 3 number of a homogeneous run, under a name that says what it is.

    gfl: the global model's accuracy on the balanced official test set (best round and the
    mean of the last 5); pfl: the sample-weighted accuracy of the personalised models on the
    clients' own test splits (for "-FT" methods after fine-tuning the head), i.e. ``acc``.
    """
    key = {"gfl": "gfl_acc", "pfl": "acc"}.get(setting)
    if key is None:
        return {}
    rows = [row for row in history if row.get(key) is not None]
    if not rows:
        return {}
    values = [row[key] for row in rows]
    best = int(np.argmax(values))
    return {
        f"best_{setting}_acc": values[best],
        f"best_{setting}_round": rows[best]["round"],
        f"last5_mean_{setting}_acc": float(np.mean(values[-5:])),
    }


def timing_totals(history: list[dict[str, Any]], wall_seconds: float) -> dict[str, float]:
    """Seconds per phase over all rounds; "wall": this process, "rounds_wall": every round,
    including those run before a resume."""
    totals: dict[str, float] = {}
    for row in history:
        for name, seconds in row["timings"].items():
            totals[name] = totals.get(name, 0.0) + seconds
    return totals | {"wall": wall_seconds, "rounds_wall": sum(row["wall"] for row in history)}


def peak_memory_mb(device: torch.device) -> dict[str, float]:
    # ru_maxrss is in KiB on Linux.
    out = {"host_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
    if device.type == "cuda":
        out["device_mb"] = torch.cuda.max_memory_allocated(device) / 2**20
    return out


def federated_record(
    *,
    key: str,
    status: str,
    config: RunConfig,
    algo_options: Any,
    feature_dim: int,
    dataset: dict[str, Any],
    partition: dict[str, Any],
    history: list[dict[str, Any]],
    wall_seconds: float,
    environment: dict[str, Any] | None = None,
    server: dict[str, Any] | None = None,
    setup: dict[str, float] | None = None,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A federated run's record: config, code version, data, history, summary, costs."""
    device = torch.device(config.device)
    summary = summarize_history(history) | setting_summary(history, config.setting)
    return {
        "record_version": RECORD_VERSION,
        "kind": KIND,
        "key": key,
        "status": status,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "config": config.to_dict(),
        "algo_options": vars(algo_options).copy(),
        "seed": config.seed,
        "feature_dim": feature_dim,
        **code_version(),
        "environment": {
            "torch": torch.__version__,
            "device": str(config.device),
            "threads": torch.get_num_threads(),
            "isa": isa.describe(device.type),
            "versions": isa.versions(),
            "cpu": cpu_class(),
        }
        | (environment or {}),
        "dataset": {k: dataset[k] for k in ("name", "source", "checksum", "classes")},
        "partition": partition,
        **({"setup": setup} if setup else {}),  # the set-up's bytes (setup_bytes) and seconds
        "history": history,
        "summary": summary if history else {},
        "timings": timing_totals(history, wall_seconds),
        "peak_memory": peak_memory_mb(device),
        **({"server": server} if server else {}),  # the method's own facts (record_extras)
        **(extra or {}),
        "cache_hit": False,
    }

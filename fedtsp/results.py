"""Run store: one JSON record per run, keyed by the hash of its full configuration.

Layout of a store folder::

    <root>/<key>.json              the run record (config, code version, history, summary)
    <root>/<key>.artifacts.npz     tensors worth keeping (global prototypes, ...)
    <root>/checkpoints/<key>.pt    the last finished round of an unfinished run

Every write goes to a temporary file first and is moved into place, so an interrupted
process never leaves a half-written record behind.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from fedtsp.atomic import atomic_save, atomic_write_bytes

RECORD_VERSION = 1


def code_version() -> dict[str, Any]:
    """Package version and, when run from a git checkout, its commit and dirty flag."""
    from fedtsp import __version__

    here = Path(__file__).resolve().parent
    info: dict[str, Any] = {"package_version": __version__, "git_commit": None, "git_dirty": None}
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=5
        )
        if commit.returncode == 0:
            info["git_commit"] = commit.stdout.strip()
            status = subprocess.run(
                ["git", "status", "--porcelain", "--untracked-files=no"],
                cwd=here,
                capture_output=True,
                text=True,
                timeout=5,
            )
            info["git_dirty"] = bool(status.stdout.strip())
    except (OSError, subprocess.SubprocessError):
        pass
    return info


def summarize_history(history: list[dict[str, Any]]) -> dict[str, Any]:
    """Best-round accuracy (the paper's number) and the mean of the last 5 evaluations."""
    accs = [row["acc"] for row in history]
    best = int(np.argmax(accs))
    summary = {
        "best_acc": accs[best],
        "best_round": history[best]["round"],
        "best_top5": max(row["top5"] for row in history),
        "final_acc": accs[-1],
        "last5_mean_acc": float(np.mean(accs[-5:])),
        "evaluations": len(accs),
    }
    globals_ = [row["global_acc"] for row in history if row.get("global_acc") is not None]
    if globals_:
        summary["best_global_acc"] = max(globals_)
        summary["final_global_acc"] = globals_[-1]
    return summary


class RunStore:
    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    def record_path(self, key: str) -> Path:
        return self.root / f"{key}.json"

    def artifacts_path(self, key: str) -> Path:
        return self.root / f"{key}.artifacts.npz"

    def checkpoint_path(self, key: str) -> Path:
        return self.root / "checkpoints" / f"{key}.pt"

    def load(self, key: str) -> dict[str, Any] | None:
        path = self.record_path(key)
        if not path.exists():
            return None
        return json.loads(path.read_text())

    def load_artifacts(self, key: str) -> dict[str, np.ndarray]:
        path = self.artifacts_path(key)
        if not path.exists():
            return {}
        with np.load(path) as data:
            return {name: data[name] for name in data.files}

    def save(self, record: dict[str, Any], artifacts: dict[str, np.ndarray] | None = None) -> Path:
        key = record["key"]
        if artifacts:
            # Artefacts first: a record on disk always has its artefacts beside it.
            atomic_save(self.artifacts_path(key), lambda f: np.savez(f, **artifacts))
            record["artifacts"] = {
                "file": self.artifacts_path(key).name,
                "names": sorted(artifacts),
            }
        path = self.record_path(key)
        atomic_write_bytes(path, json.dumps(record, indent=1, default=_json_default).encode())
        return path

    def records(self) -> Iterator[dict[str, Any]]:
        for path in sorted(self.root.glob("*.json")):
            yield json.loads(path.read_text())


def _json_default(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"cannot store {type(value).__name__} in a run record")

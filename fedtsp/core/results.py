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
import math
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from fedtsp import __version__
from fedtsp.core.atomic import atomic_save, atomic_write_bytes
from fedtsp.core.errors import UserError

RECORD_VERSION = 1


class RunStoreError(UserError, RuntimeError):
    """A run record or checkpoint in the store is unreadable or belongs to another run."""


def read_record(path: Path) -> dict[str, Any]:
    """One run record; a damaged file is named, never silently skipped or overwritten."""
    try:
        record = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise RunStoreError(
            f"run record {path} is unreadable ({type(exc).__name__}: {exc}); restore it "
            "(e.g. git checkout) or move it away to have the run redone"
        ) from exc
    if not isinstance(record, dict) or "key" not in record:
        raise RunStoreError(f"{path} is not a fedtsp run record (no 'key' field)")
    return record


# What the outputs depend on: a commit that changes only outputs or docs leaves the code
# version of regenerated outputs as it was, so that a rerun changes no committed byte.
CODE_PATHS = ("fedtsp", "notebooks/*.ipynb", "pyproject.toml")


def _git(args: list[str], cwd: Path) -> str | None:
    try:
        done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def code_version() -> dict[str, Any]:
    """Package version and, in a git checkout, the last commit that changed the code.

    `git_commit` is the newest commit touching the package, the notebooks (not their README)
    or pyproject.toml (HEAD when history is missing); `git_dirty` whether those paths differ
    from it.
    """
    repo = Path(__file__).resolve().parents[2]
    info: dict[str, Any] = {"package_version": __version__, "git_commit": None, "git_dirty": None}
    commit = _git(["log", "-1", "--format=%H", "--", *CODE_PATHS], repo) or _git(
        ["rev-parse", "HEAD"], repo
    )
    if commit:
        info["git_commit"] = commit
        status = _git(["status", "--porcelain", "--untracked-files=no", "--", *CODE_PATHS], repo)
        info["git_dirty"] = bool(status)
    return info


def short_commit(info: dict[str, Any]) -> str:
    """A record's (or `code_version()`'s) code as a table shows it: 7 digits, "+dirty" if so."""
    return (info.get("git_commit") or "unknown")[:7] + ("+dirty" if info.get("git_dirty") else "")


# The plateau rule (a run "converged"): the mean accuracy of the last PLATEAU_TAIL of its
# evaluated rounds exceeds the mean of the PLATEAU_TAIL before them by less than
# PLATEAU_WITHIN. Means of several rounds, not the best round: a personal model's accuracy on
# its small test split moves by 0.5-1 point from round to round, so a run's best round is a
# noisy maximum that a settled curve's tail stays below (seen in the pilot's runs).
PLATEAU_TAIL = 0.2
PLATEAU_WITHIN = 0.005  # accuracy as a fraction: 0.5 points
PLATEAU_RULE = (
    f"a run has converged when the mean accuracy of its last {PLATEAU_TAIL:.0%} of evaluated "
    f"rounds is less than {100 * PLATEAU_WITHIN:g} point above the mean of the "
    f"{PLATEAU_TAIL:.0%} before them"
)


def converged(accs: list[float]) -> bool:
    """Whether a curve of accuracies (fractions, one per evaluated round) reached a plateau
    by the rule above; fewer than 10 evaluations never count as one."""
    n = len(accs)
    if n < 10:
        return False
    tail = max(2, math.ceil(PLATEAU_TAIL * n))
    rise = float(np.mean(accs[-tail:])) - float(np.mean(accs[-2 * tail : -tail]))
    return rise < PLATEAU_WITHIN


def summarize_history(history: list[dict[str, Any]]) -> dict[str, Any]:
    """Best-round accuracy (the paper's number), the mean of the last 5 evaluations and
    whether the run converged (`converged`)."""
    accs = [row["acc"] for row in history]
    best = int(np.argmax(accs))
    summary = {
        "best_acc": accs[best],
        "best_round": history[best]["round"],
        "best_top5": max(row["top5"] for row in history),
        "final_acc": accs[-1],
        "last5_mean_acc": float(np.mean(accs[-5:])),
        "evaluations": len(accs),
        "converged": converged(accs),
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

    def save_checkpoint(self, key: str, state: dict[str, Any]) -> None:
        """The state after a finished round (any engine's), under the run's key."""
        import torch  # the store's readers (reports, tables) need no torch

        atomic_save(self.checkpoint_path(key), lambda f: torch.save({"key": key} | state, f))

    def load_checkpoint(self, key: str, device: Any = "cpu") -> dict[str, Any]:
        """The checkpoint of run ``key``; a damaged one or another run's is refused."""
        import torch

        path = self.checkpoint_path(key)
        try:
            state = torch.load(path, map_location=device, weights_only=False)
        except Exception as exc:  # torch reports a damaged file in many ways
            raise RunStoreError(
                f"checkpoint {path} is unreadable ({type(exc).__name__}); move it away to "
                "restart the run from round 0"
            ) from exc
        if not isinstance(state, dict) or state.get("key") != key:
            other = state.get("key") if isinstance(state, dict) else None
            raise RunStoreError(
                f"checkpoint {path} belongs to run {other}, not to run {key}; "
                "remove it or rerun without --resume"
            )
        return state

    def refuse_unfinished(self, key: str) -> None:
        """Stop before any work when an interrupted run of ``key`` waits to be resumed."""
        path = self.checkpoint_path(key)
        if path.exists():
            raise FileExistsError(
                f"an interrupted run of this config exists ({path}); pass resume=True "
                "(--resume) to continue it or force=True (--force) to restart"
            )

    def load(self, key: str) -> dict[str, Any] | None:
        path = self.record_path(key)
        if not path.exists():
            return None
        return read_record(path)

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
        atomic_write_bytes(path, json.dumps(record, indent=1, default=json_default).encode())
        return path

    def incomplete_path(self, key: str) -> Path:
        return self.root / "incomplete" / f"{key}.json"

    def save_incomplete(self, record: dict[str, Any]) -> Path:
        """A record that is not the config's nominal result (a run still going, stopped, or
        finished without some clients): kept beside the store, never served as a cache hit."""
        path = self.incomplete_path(record["key"])
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(path, json.dumps(record, indent=1, default=json_default).encode())
        return path

    def records(self) -> Iterator[dict[str, Any]]:
        for path in sorted(self.root.glob("*.json")):
            yield read_record(path)


def json_default(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"cannot store {type(value).__name__} in a run record")

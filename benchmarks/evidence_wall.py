"""Wall time of the evidence profile's reproduction from an empty store, as measured, beside
the analysis plan's estimate.

    python benchmarks/evidence_wall.py [--log LOG ...]   # default: the two committed logs

The batch spans sessions (a session's command is killed at its end and the store resumes),
so no single command times it. The log (`start`, `beat` a minute, `end`, `pause` / `resume`
lines with UTC times and the store's record count, written beside the batch by a watcher
shell loop; the first invocation predates the watcher and is reconstructed from its
records and checkpoints, and says so) is the measurement: each invocation's time from start
to its last sign of life, less its pauses (the batch was paused, never killed, while the
foreground measured something). The batch ran as two pinned worktrees one after the other
(the HtFL notebooks' runs, and notebook 08's at its addendum's commit), each with its own
log; their invocations are put in time order, and any time two of them were alive at once
is reported (it would be counted twice). Also reported: the sum of the records' own wall times over
the workers, a second view that counts no idle worker, and the plan's estimate
(`planned_run_seconds` of the plan and its addenda over the workers, plus the notebooks'
measured work).
"""

from __future__ import annotations

import argparse
import json
import re
from datetime import datetime
from pathlib import Path
from typing import Any

from facts import write_result

from fedtsp.core.paths import REPO_ROOT
from fedtsp.core.results import RunStore
from fedtsp.paper.profiles import analysis_plan_files, load_profile

LOGS = [
    REPO_ROOT / "benchmarks" / "results" / "evidence_batch_log.txt",
    REPO_ROOT / "benchmarks" / "results" / "evidence_batch_log_08.txt",
]
OUT = REPO_ROOT / "benchmarks" / "results" / "evidence_wall.json"
LINE = re.compile(r"^(start|beat|end|pause|resume) (\S+Z)")
RECONSTRUCTED = re.compile(
    r"^reconstructed-invocation-\d+ start~(\S+Z) paused~(\d+) last-checkpoint (\S+Z)"
)


def _time(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def _close_pause(out: list[dict[str, Any]], paused_at: datetime | None) -> None:
    """An invocation that ended while paused: its pause lasted to its last sign of life."""
    if out and paused_at is not None:
        out[-1]["paused"] += (out[-1]["last"] - paused_at).total_seconds()


def invocations(log: str) -> list[dict[str, Any]]:
    """Each invocation of the batch: start, last sign of life, paused and active seconds."""
    out: list[dict[str, Any]] = []
    paused_at = None
    for raw in log.splitlines():
        if m := RECONSTRUCTED.match(raw):
            start, paused, last = _time(m.group(1)), float(m.group(2)), _time(m.group(3))
            note = raw.split(" note: ")[-1]
            out.append({"start": start, "last": last, "paused": paused, "note": note})
            continue
        m = LINE.match(raw)
        if not m:
            continue
        kind, when = m.group(1), _time(m.group(2))
        if kind == "start":
            _close_pause(out, paused_at)
            paused_at = None
            out.append({"start": when, "last": when, "paused": 0.0, "note": ""})
        elif kind == "pause":
            paused_at = when
        elif kind == "resume" and paused_at is not None:
            out[-1]["paused"] += (when - paused_at).total_seconds()
            paused_at = None
        if out and kind in ("beat", "end"):
            out[-1]["last"] = when
    _close_pause(out, paused_at)
    for inv in out:
        inv["active"] = (inv["last"] - inv["start"]).total_seconds() - inv["paused"]
    return out


def overlap_seconds(found: list[dict[str, Any]]) -> float:
    """Seconds during which two invocations were alive at once (pauses not subtracted)."""
    total = 0.0
    for i, a in enumerate(found):
        for b in found[i + 1 :]:
            total += max(
                (min(a["last"], b["last"]) - max(a["start"], b["start"])).total_seconds(), 0
            )
    return total


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--log", type=Path, action="append", help="a batch log (repeatable)")
    args = parser.parse_args(argv)
    profile = load_profile("evidence")
    runs = list(RunStore(REPO_ROOT / "results" / "evidence" / "runs").records())
    found = sorted(
        (inv for log in args.log or LOGS for inv in invocations(log.read_text())),
        key=lambda inv: inv["start"],
    )
    measured = sum(inv["active"] for inv in found)
    overlap = overlap_seconds(found)
    records = sum(r["timings"]["wall"] for r in runs) / profile.workers
    plans = [json.loads(p.read_text()) for p in analysis_plan_files(profile)]
    timings = json.loads(
        (REPO_ROOT / "benchmarks" / "results" / "reproduce_times.json").read_text()
    )
    cpu = timings["profiles"]["cpu"]
    notebooks = cpu["seconds"] - cpu["runs_seconds"]
    estimate = sum(p["planned_run_seconds"] for p in plans) / profile.workers + notebooks
    payload = {
        "what": "wall time of fedtsp reproduce --profile evidence from an empty store, measured",
        "runs": len(runs),
        "invocations": [
            {k: v.isoformat() if isinstance(v, datetime) else v for k, v in inv.items()}
            for inv in found
        ],
        "measured_seconds": round(measured, 1),
        "overlap_seconds": round(overlap, 1),
        "records_wall_over_workers_seconds": round(records, 1),
        "plan_estimate_seconds": round(estimate, 1),
        "measured_over_estimate": round(measured / estimate, 3),
    }
    rows = [
        "| invocation | start (UTC) | last sign of life | paused | active |",
        "|---:|---|---|---:|---:|",
    ]
    for i, inv in enumerate(found, 1):
        rows.append(
            f"| {i} | {inv['start']:%Y-%m-%d %H:%M} | {inv['last']:%H:%M} | "
            f"{inv['paused'] / 60:.0f} min | {inv['active'] / 3600:.2f} h |"
        )
    rows += [
        "",
        f"Measured: **{measured / 3600:.2f} h** for {len(runs)} runs and the notebooks "
        f"({len(found)} invocations); the records' own wall times over {profile.workers} "
        f"workers: {records / 3600:.2f} h; the plan's estimate: {estimate / 3600:.2f} h "
        f"(measured / estimate = {measured / estimate:.2f}). Invocations alive at the same "
        f"time: {overlap / 60:.0f} min.",
    ]
    write_result(OUT, payload, "\n".join(rows))
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

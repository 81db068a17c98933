"""Wall time of a profile's reproduction from an empty store, run as a batch across sessions,
as measured, beside the analysis plan's estimate where the profile has one.

    python benchmarks/batch_wall.py [--profile evidence] [--log LOG ...]
    # default log: benchmarks/results/<profile>_batch_log.txt; output: <profile>_wall.{json,md}

The batch spans sessions (a session's command is killed at its end and the store resumes),
so no single command times it. The log is the measurement: `benchmarks/batch_heartbeat.sh`
writes `start`, a `beat` a minute and `end` beside the batch, and `benchmarks/batch_pause.sh`
adds `pause` / `resume` lines (the batch was paused, never killed, while the foreground
measured something or another batch ran alone) and `shared` / `alone` lines (the batch at the
lowest priority while a CI run shared the machine: counted as work, and reported), each with
its UTC time. Each invocation counts from its start to its last sign of life, less its
pauses; any time two invocations were alive at once is reported (it would be counted twice).

Every record of the store must have been written while a logged invocation was alive (the
script stops otherwise: a record without its log has no measured time). Also reported: the
sum of the records' own wall times over the workers, a view that counts no idle worker, and
the estimate: for a profile with an analysis plan, the plan's (`planned_run_seconds` of the
plan and its addenda over the workers), else that of `fedtsp reproduce --plan` for an empty
store at the batch's commit (the commit its log's `start` lines name); both plus the
notebooks' measured work.
"""

from __future__ import annotations

import argparse
import json
import re
import tempfile
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from facts import write_result

from fedtsp.core.paths import REPO_ROOT
from fedtsp.core.results import RunStore
from fedtsp.paper.notebook import NOTEBOOKS_DIR, find_notebooks
from fedtsp.paper.plan import make_plan, stores_at
from fedtsp.paper.profiles import Profile, analysis_plan_files, load_profile

RESULTS = REPO_ROOT / "benchmarks" / "results"
LINE = re.compile(r"^(start|beat|end|pause|resume|shared|alone) (\S+Z)")


def _time(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


# Log lines that open and close a span of an invocation: paused (not counted as work), and
# shared (the batch at the lowest priority beside heavy foreground work; counted, reported).
SPANS = {"pause": ("paused", True), "resume": ("paused", False)}
SPANS |= {"shared": ("shared", True), "alone": ("shared", False)}


def invocations(log: str) -> list[dict[str, Any]]:
    """Each invocation of the batch: start, last sign of life, and its paused, shared and
    active (alive less paused) seconds. A span still open when the invocation ends lasts to
    its last sign of life."""
    out: list[dict[str, Any]] = []
    opened: dict[str, datetime] = {}

    def close() -> None:
        for span, since in opened.items():
            out[-1][span] += (out[-1]["last"] - since).total_seconds()
        opened.clear()

    for raw in log.splitlines():
        m = LINE.match(raw)
        if not m:
            continue
        kind, when = m.group(1), _time(m.group(2))
        if kind == "start":
            if out:
                close()
            note = raw.split(" note: ")[1] if " note: " in raw else ""
            out.append({"start": when, "last": when, "paused": 0.0, "shared": 0.0, "note": note})
        elif out and kind in SPANS:
            span, opens = SPANS[kind]
            if opens:
                opened.setdefault(span, when)
            elif span in opened:
                out[-1][span] += (when - opened.pop(span)).total_seconds()
        if out and kind in ("beat", "end"):
            out[-1]["last"] = when
    if out:
        close()
    for inv in out:
        inv["active"] = (inv["last"] - inv["start"]).total_seconds() - inv["paused"]
    return out


def _covers(inv: dict[str, Any], record: dict[str, Any]) -> bool:
    """Whether the record was written while the invocation was alive."""
    end = datetime.strptime(record["created"], "%Y-%m-%dT%H:%M:%S%z")
    return inv["start"] <= end <= inv["last"] + timedelta(minutes=1)


def overlap_seconds(found: list[dict[str, Any]]) -> float:
    """Seconds during which two invocations were alive at once (pauses not subtracted)."""
    total = 0.0
    for i, a in enumerate(found):
        for b in found[i + 1 :]:
            total += max(
                (min(a["last"], b["last"]) - max(a["start"], b["start"])).total_seconds(), 0
            )
    return total


def batch_commit(found: list[dict[str, Any]]) -> str:
    """The one commit the invocations' `start` notes name (a batch keeps one code version)."""
    commits = {m[0] for inv in found if (m := re.search(r"\b[0-9a-f]{7,40}\b", inv["note"]))}
    if len(commits) != 1:
        raise SystemExit(f"the log's start lines name {len(commits)} commits, not one")
    return commits.pop()


def estimate_seconds(profile: Profile, commit: str) -> tuple[float, str]:
    """The estimate the batch is measured against, and what it is: the analysis plan's where
    the profile has one, else what `fedtsp reproduce --plan` gave for an empty store at the
    batch's commit (its runs priced from the stores committed there, the profile's older
    records included: twins of the same configs, timed where they were made). Both add the
    notebooks' own measured work."""
    timings = json.loads((RESULTS / "reproduce_times.json").read_text())
    cpu = timings["profiles"]["cpu"]
    notebooks = cpu["seconds"] - cpu["runs_seconds"]
    plans = [json.loads(p.read_text()) for p in analysis_plan_files(profile)]
    if plans:
        runs = sum(p["planned_run_seconds"] for p in plans)
        return runs / profile.workers + notebooks, "the analysis plan's estimate"
    with tempfile.TemporaryDirectory() as tmp:
        stores = stores_at(commit, Path(tmp) / "then")
        planned, _ = make_plan(
            profile, find_notebooks(NOTEBOOKS_DIR), Path(tmp), profile.workers, stores
        )
    if any(r.source != "twin" for r in planned):
        raise SystemExit(f"runs of {profile.name} without a measured twin at {commit}")
    runs = sum(r.seconds for r in planned)
    return runs / profile.workers + notebooks, (
        f"the estimate of `fedtsp reproduce --profile {profile.name} --plan` for an empty "
        f"store at {commit}, its runs priced from the stores committed there"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--profile", default="evidence", help="the profile (default: evidence)")
    parser.add_argument("--log", type=Path, action="append", help="a batch log (repeatable)")
    args = parser.parse_args(argv)
    profile = load_profile(args.profile)
    runs = list(RunStore(REPO_ROOT / "results" / profile.name / "runs").records())
    logs = args.log or [RESULTS / f"{profile.name}_batch_log.txt"]
    found = sorted(
        (inv for log in logs for inv in invocations(log.read_text())),
        key=lambda inv: inv["start"],
    )
    logged = sum(inv["active"] for inv in found)
    shared = sum(inv["shared"] for inv in found)
    overlap = overlap_seconds(found)
    unlogged = [r["key"] for r in runs if not any(_covers(inv, r) for inv in found)]
    if unlogged:
        raise SystemExit(f"{len(unlogged)} records no logged invocation covers, e.g. {unlogged[0]}")
    records = sum(r["timings"]["wall"] for r in runs) / profile.workers
    estimate, estimated_by = estimate_seconds(profile, batch_commit(found))
    payload = {
        "what": f"wall time of fedtsp reproduce --profile {profile.name} from an empty store, "
        "measured",
        "runs": len(runs),
        "invocations": [
            {k: v.isoformat() if isinstance(v, datetime) else v for k, v in inv.items()}
            for inv in found
        ],
        "shared_seconds": round(shared, 1),
        "measured_seconds": round(logged, 1),
        "overlap_seconds": round(overlap, 1),
        "records_wall_over_workers_seconds": round(records, 1),
        "estimate_seconds": round(estimate, 1),
        "estimated_by": estimated_by,
        "measured_over_estimate": round(logged / estimate, 3),
    }
    against = (
        f"{estimated_by}: {estimate / 3600:.2f} h (measured / estimate = {logged / estimate:.2f})"
    )
    rows = [
        "| invocation | start (UTC) | last sign of life | paused | active | of which shared |",
        "|---:|---|---|---:|---:|---:|",
    ]
    for i, inv in enumerate(found, 1):
        rows.append(
            f"| {i} | {inv['start']:%Y-%m-%d %H:%M} | {inv['last']:%H:%M} | "
            f"{inv['paused'] / 60:.0f} min | {inv['active'] / 3600:.2f} h | "
            f"{inv['shared'] / 60:.0f} min |"
        )
    rows += [
        "",
        f"Measured: **{logged / 3600:.2f} h** for {len(runs)} runs and the notebooks, over "
        f"{len(found)} invocations. The records' own wall times over {profile.workers} workers: "
        f"{records / 3600:.2f} h; {against}. Of the logged time, "
        f"{shared / 60:.0f} min ran at the lowest priority beside foreground work (a CI run), "
        f"so slower than alone. Invocations alive at the same time: {overlap / 60:.0f} min.",
    ]
    write_result(RESULTS / f"{profile.name}_wall.json", payload, "\n".join(rows))
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

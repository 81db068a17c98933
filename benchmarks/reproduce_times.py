"""Wall time of the reproductions a user starts most: the smoke profile from an empty store,
and the cpu profile served from the committed run store (its notebooks only), beside the
last measured cpu reproduction from an empty store.

    python benchmarks/reproduce_times.py [--profiles smoke cpu]

Each reproduction runs in a subprocess on a temporary folder with an empty data cache; the
cpu one starts from a copy of the committed store, so it runs no experiment. The committed
outputs and the user's cache are not touched. The empty-store row comes from
``reproduce_cpu_empty_store_baseline.json`` (``benchmarks/reproduce_empty_store.py``
measures it anew, in about two hours).
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

from facts import machine_facts, write_result
from reproduce_empty_store import RESULTS, _clock, reproduce, same_tables

from fedtsp.core.paths import REPO_ROOT
from fedtsp.core.results import code_version

# Profiles whose committed store the measurement starts from; the others start empty.
COMMITTED_STORE = {"cpu"}


def measure(profile: str, work: Path) -> dict[str, Any]:
    """One reproduction of ``profile`` in ``work``: wall time, run time, notebooks' times."""
    stored = profile in COMMITTED_STORE
    if stored:
        shutil.copytree(
            REPO_ROOT / "results" / profile / "runs", work / "results" / profile / "runs"
        )
    result = reproduce(profile, None, work) | {"store": "committed" if stored else "empty"}
    summary = json.loads((work / "results" / profile / "reproduce_summary.json").read_text())
    result["runs"] = summary["runs"]
    if stored:
        result["same_tables"] = same_tables(profile, work)
    return result


def table(result: dict[str, Any]) -> str:
    lines = [
        "| profile | run store at the start | runs | wall time | of which runs | notebooks |",
        "| --- | --- | ---: | ---: | ---: | ---: |",
    ]
    for name, r in result["profiles"].items():
        notebooks = sum(r["notebooks"].values())
        ran = f"{r['runs']} reused" if r["store"] == "committed" else f"{r['runs']} run"
        lines.append(
            f"| `{name}` | {r['store']} | {ran} | {_clock(r['seconds'])} "
            f"| {_clock(r['runs_seconds'])} | {_clock(notebooks)} |"
        )
    base = result["empty_store_baseline"]
    lines.append(
        f"| `{base['profile']}` | empty (code {base['code']}, measured once) | {base['runs']} "
        f"federated run | {_clock(base['seconds'])} | {_clock(base['runs_seconds'])} "
        f"| {_clock(base['seconds'] - base['runs_seconds'])} |"
    )
    lines += ["", "Each row: one `fedtsp reproduce --profile P` with an empty data cache."]
    for name, r in result["profiles"].items():
        same = r.get("same_tables")
        if same:
            lines[-1] += (
                f" `{name}`'s regenerated tables equal the committed ones: "
                f"{same['tables'] - len(same['differ'])} of {same['tables']}."
            )
    lines.append(f"Last row: {base['what']}.")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--profiles", nargs="+", default=["smoke", "cpu"])
    parser.add_argument("--out", default=str(RESULTS / "reproduce_times.json"))
    args = parser.parse_args(argv)
    code = code_version()
    baseline = json.loads((RESULTS / "reproduce_cpu_empty_store_baseline.json").read_text())
    profiles = {}
    for profile in args.profiles:
        work = Path(tempfile.mkdtemp(prefix=f"fedtsp-times-{profile}-"))
        try:
            profiles[profile] = measure(profile, work)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        print(f"{profile}: {_clock(profiles[profile]['seconds'])}", flush=True)
    result = {
        "what": "wall time of fedtsp reproduce per profile, each in a subprocess",
        "profiles": profiles,
        "empty_store_baseline": {
            key: baseline[key]
            for key in ("what", "profile", "code", "seconds", "runs_seconds", "runs")
        },
        "machine": machine_facts(),
    }
    write_result(Path(args.out), result, table(result), code)
    print(Path(args.out).with_suffix(".md").read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""How long the command line takes to answer `--help`, a bad flag and `fedtsp claims` (which
reads committed files), today and at an earlier commit: median of 5 runs each, warm and cold.

    python benchmarks/cli_latency.py [--then 2840f26] [--repeats 5]

Each command runs as `python -m fedtsp ...` in a fresh process. Warm: Python's bytecode
cache is in place (one untimed run first). Cold: every run gets an empty bytecode cache
(``PYTHONPYCACHEPREFIX``), so every module the command imports is compiled from source, as
on the first call after installing. The earlier commit's code is taken with ``git archive``
and run from a temporary folder with the same interpreter and packages.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from io import BytesIO
from pathlib import Path
from typing import Any

from facts import machine_facts, write_result

from fedtsp.core.paths import REPO_ROOT
from fedtsp.core.results import code_version

# Each command, the exit status it must end with (a command that fails early for another
# reason would be timed answering something else), and whether the 1 s target applies: to
# help and bad flags; `fedtsp claims` reads and formats committed tables with pandas.
COMMANDS = (
    (("--help",), 0, True),
    (("run", "--help"), 0, True),
    (("run", "--algorithm", "fedtsp", "--help"), 0, True),
    (("run", "--alpha", "abc"), 2, True),
    (("run", "--algorithm", "fedtsp", "--lam", "-1"), 2, True),
    (("run", "--family", "htfe7"), 2, True),
    (("claims",), 0, False),
    (("claims", "F11"), 0, False),
)
TARGET_S = 1.0  # what the issue asks of every one of them


def seconds(
    command: tuple[str, ...], status: int, code: Path, cold: bool, repeats: int
) -> list[float]:
    """Wall seconds of `repeats` fresh processes running `command` on the code in `code`;
    each must exit with `status`."""
    env = {**os.environ, "PYTHONPATH": str(code)}
    times = []
    with tempfile.TemporaryDirectory() as caches:
        if not cold:
            subprocess.run([sys.executable, "-m", "fedtsp", *command], env=env, cwd=code,
                           capture_output=True, check=False)  # fmt: skip
        for i in range(repeats):
            if cold:
                env["PYTHONPYCACHEPREFIX"] = str(Path(caches) / str(i))
            start = time.perf_counter()
            done = subprocess.run([sys.executable, "-m", "fedtsp", *command], env=env,
                                  cwd=code, capture_output=True, check=False)  # fmt: skip
            times.append(time.perf_counter() - start)
            if done.returncode != status:
                raise SystemExit(
                    f"fedtsp {' '.join(command)} in {code} exited {done.returncode}, not "
                    f"{status}: {done.stderr.decode().strip()[-300:]}"
                )
    return times


def extract(commit: str, folder: Path) -> None:
    """The package as it was at `commit` (``git archive``), with the claims files `fedtsp
    claims` reads, into `folder`."""
    archive = subprocess.run(
        ["git", "archive", commit, "fedtsp", "notebooks", "results/cpu/claims.csv"],
        cwd=REPO_ROOT,
        capture_output=True,
        check=True,
    ).stdout
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(folder, filter="data")


def measure(then: str, repeats: int) -> dict[str, Any]:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        extract(then, Path(tmp))
        for command, status, targeted in COMMANDS:
            row: dict[str, Any] = {
                "command": "fedtsp " + " ".join(command),
                "status": status,
                "targeted": targeted,
            }
            for side, code in (("then", Path(tmp)), ("now", REPO_ROOT)):
                for state in ("warm", "cold"):
                    times = seconds(command, status, code, state == "cold", repeats)
                    row[f"{side}_{state}"] = statistics.median(times)
                    row[f"{side}_{state}_all"] = times
            rows.append(row)
    return {"then": then, "repeats": repeats, "target_s": TARGET_S, "rows": rows}


def table(result: dict[str, Any]) -> str:
    then = result["then"]
    lines = [
        f"| command | {then} warm | {then} cold | today warm | today cold |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for r in result["rows"]:
        cells = [f"{r[k]:.2f} s" for k in ("then_warm", "then_cold", "now_warm", "now_cold")]
        lines.append(f"| `{r['command']}` | " + " | ".join(cells) + " |")
    worst = max(max(r["now_warm"], r["now_cold"]) for r in result["rows"] if r["targeted"])
    others = [r for r in result["rows"] if not r["targeted"]]
    verdict = "met" if worst <= result["target_s"] else "not met"
    lines += [
        "",
        f"Median of {result['repeats']} fresh processes each; cold: an empty bytecode cache for "
        f"every run. Target: help and bad flags within {result['target_s']:g} s; slowest today "
        f"{worst:.2f} s ({verdict}). Not held to it: "
        + ", ".join(f"`{r['command']}`" for r in others)
        + " (reads the committed claims file with pandas, whose first import compiles it).",
    ]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--then", default="2840f26", help="the earlier commit (default 2840f26)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default=str(REPO_ROOT / "benchmarks/results/cli_latency.json"))
    args = parser.parse_args()
    code = code_version()
    result = measure(args.then, args.repeats) | {"machine": machine_facts()}
    write_result(Path(args.out), result, table(result), code=code)
    print(table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The batch runner: `fedtsp reproduce --profile P [--only 03 ...]`.

1. Collects the runs every selected notebook needs (`fedtsp.plans`) and runs the missing
   ones, `workers` at a time, into `<results>/<P>/runs` (finished runs are reused, an
   interrupted one resumes from its checkpoint).
2. Executes each notebook with papermill into `papermill_runs/<P>/`, injecting the
   profile's parameters; a failing notebook is reported and the others still run.
3. Rewrites the results index (`<results>/README.md`) from the notebooks' manifests and
   prints a summary; the exit status is non-zero if any run or notebook failed.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedtsp.config import ConfigError
from fedtsp.experiments import DataSource, RunsFailed, RunSpec, run_all
from fedtsp.outputs import write_index
from fedtsp.plans import notebook_plan
from fedtsp.profiles import Profile, load_profile, notebook_parameters

NOTEBOOKS_DIR = Path(__file__).resolve().parents[1] / "notebooks"


@dataclass
class NotebookResult:
    notebook: str
    ok: bool
    seconds: float
    error: str = ""


def find_notebooks(notebooks_dir: Path, only: list[str] | None = None) -> list[Path]:
    """Numbered notebooks (`NN_name.ipynb`), optionally only those whose name starts with `only`."""
    found = sorted(p for p in notebooks_dir.glob("[0-9][0-9]_*.ipynb"))
    if not found:
        raise ConfigError(f"no numbered notebooks (NN_name.ipynb) in {notebooks_dir}")
    if only:
        unknown = [o for o in only if not any(p.stem.startswith(o) for p in found)]
        if unknown:
            raise ConfigError(
                f"--only {' '.join(unknown)} matches no notebook; have: "
                f"{', '.join(p.stem for p in found)}"
            )
        found = [p for p in found if any(p.stem.startswith(o) for o in only)]
    return found


def collect_runs(
    profile: Profile, notebooks: list[Path], results_root: Path
) -> tuple[list[RunSpec], DataSource]:
    source = DataSource(profile.data, profile.synthetic_per_class)
    specs: list[RunSpec] = []
    for nb in notebooks:
        params = notebook_parameters(profile, nb.stem, results_root)
        specs += notebook_plan(nb.stem, params, source)
    return specs, source


def execute_notebook(
    path: Path, out_dir: Path, parameters: dict[str, Any], progress: bool = True
) -> NotebookResult:
    """Run one notebook with papermill; failures are caught and returned, not raised."""
    import papermill

    out_dir.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    try:
        papermill.execute_notebook(
            str(path),
            str(out_dir / path.name),
            parameters=parameters,
            cwd=str(path.parent),
            kernel_name="python3",
            progress_bar=progress,
            log_output=False,
        )
    except Exception as exc:  # papermill raises PapermillExecutionError with the cell's error
        last = [line for line in str(exc).strip().splitlines() if line.strip()][-1:]
        error = (last[0] if last else type(exc).__name__)[:300]
        return NotebookResult(path.stem, False, time.perf_counter() - start, error)
    return NotebookResult(path.stem, True, time.perf_counter() - start)


def reproduce(
    profile_name: str,
    only: list[str] | None = None,
    results_root: str | Path = "results",
    papermill_root: str | Path = "papermill_runs",
    notebooks_dir: str | Path = NOTEBOOKS_DIR,
    workers: int | None = None,
    progress: bool = True,
) -> int:
    """Regenerate the profile's tables and figures; returns the process exit status."""
    profile = load_profile(profile_name)
    results_root = Path(results_root).resolve()
    notebooks = find_notebooks(Path(notebooks_dir), only)
    workers = profile.workers if workers is None else workers
    start = time.perf_counter()
    print(f"profile {profile.name}: {profile.about}")
    print(f"notebooks: {', '.join(nb.stem for nb in notebooks)}")

    specs, source = collect_runs(profile, notebooks, results_root)
    runs_error = ""
    run_keys: set[str] = set()
    try:
        records = run_all(specs, source, results_root / profile.name / "runs", workers, progress)
        run_keys = {rec["key"] for rec in records}
    except RunsFailed as exc:  # the notebooks then report which of their runs are missing
        runs_error = str(exc)
        print(runs_error)
    runs_seconds = time.perf_counter() - start

    results = []
    for nb in notebooks:
        params = notebook_parameters(profile, nb.stem, results_root)
        print(f"\n[{nb.stem}] executing ...", flush=True)
        result = execute_notebook(nb, Path(papermill_root) / profile.name, params, progress)
        status = "ok" if result.ok else f"FAILED: {result.error}"
        print(f"[{nb.stem}] {status} ({result.seconds:.0f} s)", flush=True)
        results.append(result)
    write_index(results_root)

    total = time.perf_counter() - start
    failed = [r for r in results if not r.ok]
    print(f"\nSummary (profile {profile.name}, {total:.0f} s; runs {runs_seconds:.0f} s):")
    for r in results:
        print(f"  {r.notebook:<28} {'ok' if r.ok else 'FAILED'}  {r.seconds:7.0f} s")
    summary = {
        "profile": profile.name,
        "seconds": round(total, 1),
        "runs_seconds": round(runs_seconds, 1),
        "runs": len(run_keys),
        "notebooks": {r.notebook: {"ok": r.ok, "seconds": round(r.seconds, 1)} for r in results},
        "runs_error": runs_error,
    }
    (results_root / profile.name).mkdir(parents=True, exist_ok=True)
    (results_root / profile.name / "reproduce_summary.json").write_text(
        json.dumps(summary, indent=1) + "\n"
    )
    if failed or runs_error:
        print(f"{len(failed)} notebook(s) failed" + ("; some runs failed" if runs_error else ""))
        return 1
    return 0

"""The batch runner: `fedtsp reproduce --profile P [--only 03 ...] [--allow-partial]`.

1. Collects the runs every selected notebook needs (`fedtsp.paper.notebook_runs`) and runs the missing
   ones into `<results>/<P>/runs` (finished runs are reused, an interrupted one resumes
   from its checkpoint): `workers` at a time here, or as Ray tasks on a cluster
   (`--executor ray`, `fedtsp.paper.ray_executor`).
2. Executes each notebook with papermill into `papermill_runs/<P>/`, injecting the
   profile's parameters; a failing notebook is reported and the others still run. The
   executed copy is normalised (no timestamps, no stderr stream, no absolute paths), so
   that executing it again from the same runs gives the same bytes.
3. Rewrites the results index (`<results>/README.md`) from the notebooks' manifests,
   writes `<results>/<P>/reproduce_summary.json` (statuses; byte-stable) and
   `reproduce_timings.json` (wall times; not committed), and prints a summary.

Exit status: 0 when every notebook is complete (planned skips allowed), 1 when a run or
a notebook failed, 3 when a notebook is partial (it lacked something the profile expects)
and --allow-partial was not given.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedtsp.core.atomic import atomic_write_text
from fedtsp.core.config import ConfigError
from fedtsp.core.paths import portable_path, scrub_paths
from fedtsp.core.results import RunStore
from fedtsp.paper.executors import Executor, LocalExecutor
from fedtsp.paper.experiments import DataSource, RunsFailed, RunSpec, run_all
from fedtsp.paper.notebook import NOTEBOOKS_DIR, find_notebooks
from fedtsp.paper.notebook_runs import notebook_plan
from fedtsp.paper.outputs import write_index
from fedtsp.paper.profiles import Profile, load_profile, notebook_parameters

EXIT_FAILED = 1
EXIT_PARTIAL = 3


@dataclass
class NotebookResult:
    notebook: str
    ok: bool
    seconds: float
    error: str = ""
    skipped: list[dict[str, Any]] = field(default_factory=list)

    @property
    def status(self) -> str:
        if not self.ok:
            return "failed"
        return "partial" if any(not s["planned"] for s in self.skipped) else "ok"


def collect_runs(
    profile: Profile, notebooks: list[Path], results_root: Path
) -> tuple[list[RunSpec], DataSource]:
    source = DataSource(profile.data, profile.synthetic_per_class)
    specs: list[RunSpec] = []
    for nb in notebooks:
        params = notebook_parameters(profile, nb.stem, results_root)
        specs += notebook_plan(nb.stem, params, source)
    return specs, source


_TIMES = ("start_time", "end_time", "duration")


def normalise_executed(path: Path) -> None:
    """Make an executed notebook a function of its inputs and runs only.

    Drops papermill's and the kernel's timestamps and stderr streams (progress bars,
    warnings), gives the injected cell a fixed id, and writes paths portably.
    """
    nb = json.loads(path.read_text(encoding="utf-8"))
    meta = nb.get("metadata", {}).get("papermill", {})
    for key in _TIMES:
        meta.pop(key, None)
    for key in ("input_path", "output_path"):
        if meta.get(key):
            meta[key] = portable_path(meta[key])
    for cell in nb.get("cells", []):
        cell.get("metadata", {}).pop("execution", None)
        for key in _TIMES:
            cell.get("metadata", {}).get("papermill", {}).pop(key, None)
        if "injected-parameters" in cell.get("metadata", {}).get("tags", []):
            cell["id"] = "injected-parameters"
        if "outputs" in cell:
            cell["outputs"] = _merge_streams(
                o
                for o in cell["outputs"]
                if not (o.get("output_type") == "stream" and o.get("name") == "stderr")
            )
    text = json.dumps(nb, indent=1, sort_keys=True, ensure_ascii=False)
    atomic_write_text(path, scrub_paths(text) + "\n")


def _merge_streams(outputs) -> list[dict[str, Any]]:
    """Join consecutive stdout pieces: how the kernel splits a stream depends on timing."""
    merged: list[dict[str, Any]] = []
    for out in outputs:
        prev = merged[-1] if merged else None
        if (
            prev
            and out.get("output_type") == prev.get("output_type") == "stream"
            and out.get("name") == prev.get("name")
        ):
            prev["text"] = ("".join(prev["text"]) + "".join(out["text"])).splitlines(keepends=True)
        else:
            merged.append(out)
    return merged


def _manifest_skips(results_root: Path, profile: str, notebook: str) -> list[dict[str, Any]]:
    path = results_root / profile / "manifest" / f"{notebook}.json"
    try:
        return list(json.loads(path.read_text()).get("skipped", []))
    except (OSError, ValueError):
        return []


def execute_notebook(
    path: Path, out_dir: Path, parameters: dict[str, Any], progress: bool = True
) -> NotebookResult:
    """Run one notebook with papermill; failures are caught and returned, not raised."""
    import papermill

    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / path.name
    start = time.perf_counter()
    error = ""
    try:
        papermill.execute_notebook(
            str(path),
            str(target),
            parameters=parameters,
            cwd=str(path.parent),
            kernel_name="python3",
            progress_bar=progress,
            log_output=False,
        )
    except Exception as exc:  # papermill raises PapermillExecutionError with the cell's error
        last = [line for line in str(exc).strip().splitlines() if line.strip()][-1:]
        error = scrub_paths(last[0] if last else type(exc).__name__)[:300]
    seconds = time.perf_counter() - start
    if target.exists():
        normalise_executed(target)
    return NotebookResult(path.stem, not error, seconds, error)


def reproduce(
    profile_name: str,
    only: list[str] | None = None,
    results_root: str | Path = "results",
    papermill_root: str | Path = "papermill_runs",
    notebooks_dir: str | Path = NOTEBOOKS_DIR,
    workers: int | None = None,
    progress: bool = True,
    allow_partial: bool = False,
    prune: bool = False,
    executor: str = "local",
    ray_address: str | None = None,
) -> int:
    """Regenerate the profile's tables and figures; returns the process exit status.
    ``prune``: delete the store's records no notebook uses (all notebooks selected).
    ``executor``: "local" (``workers`` processes here) or "ray" (one Ray task per run, on
    the cluster at ``ray_address``, else Ray's own RAY_ADDRESS, else one started here)."""
    profile = load_profile(profile_name)
    results_root = Path(results_root).resolve()
    notebooks = find_notebooks(Path(notebooks_dir), only)
    workers = profile.workers if workers is None else workers
    runner = make_executor(executor, workers, profile, ray_address)
    start = time.perf_counter()
    print(f"profile {profile.name}: {profile.about}")
    print(f"notebooks: {', '.join(nb.stem for nb in notebooks)}")

    specs, source = collect_runs(profile, notebooks, results_root)
    runs_error = ""
    run_keys: set[str] = set()
    try:
        store = results_root / profile.name / "runs"
        records = run_all(specs, source, store, progress=progress, executor=runner)
        run_keys = {rec["key"] for rec in records}
        unused = unused_records(RunStore(results_root / profile.name / "runs"), run_keys)
        if unused and prune:
            for path in unused:
                path.unlink()
            print(f"pruned {len(unused)} stored files no notebook of the profile uses")
        elif unused:
            print(
                f"{len(unused)} stored files no notebook of the profile uses (--prune deletes them)"
            )
    except RunsFailed as exc:  # the notebooks then report which of their runs are missing
        runs_error = scrub_paths(str(exc))
        print(runs_error)
    runs_seconds = time.perf_counter() - start

    results = []
    for nb in notebooks:
        # The notebook reads every value from the profile itself: it gets only the name and
        # where the results live (relative, so the executed copy holds no machine path).
        params = {"profile": profile.name, "results_root": os.path.relpath(results_root, nb.parent)}
        print(f"\n[{nb.stem}] executing ...", flush=True)
        result = execute_notebook(nb, Path(papermill_root) / profile.name, params, progress)
        result.skipped = _manifest_skips(results_root, profile.name, nb.stem)
        status = result.status if result.ok else f"FAILED: {result.error}"
        print(f"[{nb.stem}] {status} ({result.seconds:.0f} s)", flush=True)
        results.append(result)
    _write_summary(results_root / profile.name, profile, results, run_keys, runs_error)
    write_index(results_root)  # after the summary: the index lists the profile's planned skips
    total = time.perf_counter() - start
    atomic_write_text(
        results_root / profile.name / "reproduce_timings.json",
        json.dumps(
            {
                "profile": profile.name,
                "seconds": round(total, 1),
                "runs_seconds": round(runs_seconds, 1),
                "notebooks": {r.notebook: round(r.seconds, 1) for r in results},
            },
            indent=1,
        )
        + "\n",
    )
    return _report(profile, results, total, runs_seconds, runs_error, allow_partial)


def make_executor(
    name: str, workers: int, profile: Profile, ray_address: str | None = None
) -> Executor:
    """The batch's executor by name, checked before any work."""
    if name == "local":
        if ray_address is not None:
            raise ConfigError("--ray-address is an option of --executor ray")
        return LocalExecutor(workers)
    if name == "ray":
        from fedtsp.paper.ray_executor import RayExecutor, import_ray

        import_ray()  # not installed: one line now, not after the notebooks' planning
        return RayExecutor(profile, ray_address)
    raise ConfigError(f"executor {name!r} is unknown; choose local or ray")


def unused_records(store: RunStore, keys: set[str]) -> list[Path]:
    """The store's files (records, their artifacts) whose run key is not in ``keys``."""
    files = sorted(p for p in store.root.glob("*") if p.is_file())
    return [p for p in files if p.name.split(".")[0] not in keys]


def _write_summary(folder: Path, profile: Profile, results, run_keys, runs_error: str) -> None:
    summary = {
        "profile": profile.name,
        "runs": len(run_keys),
        "runs_error": runs_error,
        "planned_skips": profile.planned_skips,
        "notebooks": {
            r.notebook: {"status": r.status, "error": r.error, "skipped": r.skipped}
            for r in results
        },
    }
    folder.mkdir(parents=True, exist_ok=True)
    atomic_write_text(folder / "reproduce_summary.json", json.dumps(summary, indent=1) + "\n")


def _report(profile, results, total, runs_seconds, runs_error, allow_partial) -> int:
    print(f"\nSummary (profile {profile.name}, {total:.0f} s; runs {runs_seconds:.0f} s):")
    for r in results:
        print(
            f"  {r.notebook:<28} {r.status.upper() if r.status != 'ok' else 'ok':<8} {r.seconds:5.0f} s"
        )
    # A notebook's planned skips carry the profile's own reasons: the profile's list is all.
    if profile.planned_skips:
        print("Planned skips (the profile leaves these out on purpose):")
        for item, why in profile.planned_skips.items():
            print(f"  {item}: {why}")
    partial = [(r.notebook, s) for r in results for s in r.skipped if not s["planned"]]
    if partial:
        print("PARTIAL results (something this profile expects is missing here):")
        for notebook, s in partial:
            remedy = f" To get it: {s['remedy']}" if s["remedy"] else ""
            print(f"  {notebook}: {s['affects']} lack {s['item']}: {s['reason']}{remedy}")
    failed = [r for r in results if not r.ok]
    if failed or runs_error:
        print(f"{len(failed)} notebook(s) failed" + ("; some runs failed" if runs_error else ""))
        return EXIT_FAILED
    if partial and not allow_partial:
        print(
            f"{len({n for n, _ in partial})} notebook(s) partial; install what is missing, or "
            "rerun with --allow-partial to accept partial results"
        )
        return EXIT_PARTIAL
    return 0

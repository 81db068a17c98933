"""`fedtsp verify`: rerun stored runs from scratch with today's code and compare histories.

What a reviewer checking one number runs. The runs to check are named by a table cell
(`fedtsp verify --profile cpu table1 FedTSP-MiniLM cifar100`: the runs behind the cells of
Table 1 whose labels include every value given), by run key (`--key`), or drawn as a seeded
random sample of the profile's store (`--sample N`). Each is rerun from its record's config
into a temporary store (the committed store is only read) and reported as identical, or
with the largest difference per metric and the first round where the histories part.

Each record is rerun as it was made: in a fresh process with the record's thread count and
CPU kernels (fedtsp.core.isa): AVX2-pinned records, and records made unpinned at the AVX2
level, with the AVX2 pins, so any x86-64 machine with AVX2 can check them; other unpinned
records with this machine's own kernels, which match only on the record's CPU class (vendor
included). Each line says which machines can check the record and whether this one can.
"""

from __future__ import annotations

import math
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from fedtsp.core import isa
from fedtsp.core.config import ConfigError, RunConfig
from fedtsp.core.machine import cpu_class, same_class
from fedtsp.core.results import RunStore, short_commit
from fedtsp.engine.simulation import run_key
from fedtsp.paper.executors import LocalExecutor
from fedtsp.paper.experiments import DataSource, RunsFailed, RunSpec, run_all
from fedtsp.paper.notebook_runs import notebook_plan
from fedtsp.paper.profiles import Profile, load_profile, notebook_parameters

# Values of a history row that measure time or the machine, not the computation.
UNTIMED = {"timings", "wall"}


def _base_family(spec: RunSpec, params: dict[str, Any]) -> bool:
    return spec.labels.get("family") == params["base"].get("family")


def _other_family(spec: RunSpec, params: dict[str, Any]) -> bool:
    return not _base_family(spec, params)


def _every(spec: RunSpec, params: dict[str, Any]) -> bool:
    return True


# A table or figure name -> (its notebook, which of the notebook's runs it shows).
TABLES: dict[str, tuple[str, Callable[[RunSpec, dict[str, Any]], bool]]] = {
    "fig1": ("02_prototype_semantics", _every),
    "table1": ("03_main_table", _base_family),
    "appendixD": ("03_main_table", _other_family),
    "table2": ("04_ablations", _every),
    "fig5": ("05_llm_robustness", _every),
    "table4": ("06_dp", _every),
    "table3": ("07_homogeneous", _every),
    "fmcl": ("08_fmcl", _every),
}


@dataclass
class Check:
    """One rerun run: the record's key and labels, and how today's history compares."""

    key: str
    label: str
    rounds: int
    code: str
    cpu: bool | None  # whether this machine can match it bit for bit; None: not known
    checkable: str = ""  # which machines can: "any x86-64 machine with AVX2" or "only on ..."
    new_key: str = ""
    differences: dict[str, float] = field(default_factory=dict)  # metric -> largest |diff|
    first_round: int | None = None
    error: str = ""

    @property
    def identical(self) -> bool:
        return not self.error and not self.differences and self.new_key == self.key

    def result(self) -> str:
        """What the rerun showed, in words."""
        if self.error:
            return f"rerun failed: {self.error}"
        text = "" if self.new_key == self.key else f"today's code gives it the key {self.new_key}; "
        if not self.differences:
            return text + f"identical history ({self.rounds} evaluations)"
        worst = ", ".join(f"{m} {d:.4g}" for m, d in sorted(self.differences.items()))
        return text + f"differs from round {self.first_round}; largest differences: {worst}"

    def line(self) -> str:
        return f"{self.key} {self.label} (code {self.code}; {self.where()}): {self.result()}"

    def where(self) -> str:
        """Which machines can check the record, and whether this one can."""
        here = {True: "this machine can", False: "this machine cannot", None: "unknown here"}
        return f"checkable {self.checkable}; {here[self.cpu]}"


def compare_histories(
    recorded: Sequence[dict[str, Any]], rerun: Sequence[dict[str, Any]]
) -> tuple[dict[str, float], int | None]:
    """(metric -> largest absolute difference, first differing round) of two histories;
    timings are left out, a metric present on one side only counts as an infinite one, and
    unequal lengths part at the first missing round."""
    differences: dict[str, float] = {}
    first: int | None = None
    for i in range(max(len(recorded), len(rerun))):
        if i >= len(recorded) or i >= len(rerun):
            row = (recorded if i < len(recorded) else rerun)[i]
            differences["rounds"] = math.inf
            first = row.get("round", i) if first is None else first
            break
        a, b = recorded[i], rerun[i]
        for name in (set(a) | set(b)) - UNTIMED:
            gap = _gap(a.get(name), b.get(name))
            if gap:
                differences[name] = max(differences.get(name, 0.0), gap)
                first = a.get("round", i) if first is None else first
    return differences, first


def _gap(a: Any, b: Any) -> float:
    """Largest absolute difference of two values (numbers or lists of them); NaN == NaN."""
    if a is None or b is None:
        return 0.0 if a is b else math.inf
    if isinstance(a, list | tuple) or isinstance(b, list | tuple):
        if not isinstance(a, list | tuple) or not isinstance(b, list | tuple) or len(a) != len(b):
            return math.inf
        return max((_gap(x, y) for x, y in zip(a, b, strict=True)), default=0.0)
    if isinstance(a, int | float) and isinstance(b, int | float):
        if math.isnan(a) and math.isnan(b):
            return 0.0
        return abs(float(a) - float(b)) if a != b else 0.0
    return 0.0 if a == b else math.inf


def _full_key(store: RunStore, key: str) -> str:
    """The stored run key that `key` starts (at least 6 characters, one stored run's
    only), or `key` itself."""
    if len(key) < 6 or (store.root / f"{key}.json").exists():
        return key
    found = sorted(p.stem for p in store.root.glob(f"{key}*.json"))
    if len(found) > 1:
        raise ConfigError(f"run key {key} starts {len(found)} stored runs; give more of it")
    return found[0] if found else key


def select(
    profile: Profile,
    store: RunStore,
    source: DataSource,
    results_root: str | Path,
    *,
    table: str | None = None,
    values: Sequence[str] = (),
    keys: Sequence[str] = (),
    sample: int | None = None,
    sample_seed: int = 0,
) -> list[tuple[dict[str, Any], str]]:
    """(record, label) of every run to check, in the order asked; unknown names fail here."""
    chosen: dict[str, str] = {}
    if table is not None:
        if table not in TABLES:
            raise ConfigError(f"unknown table {table!r}; choose one of {', '.join(TABLES)}")
        notebook, shown = TABLES[table]
        params = notebook_parameters(profile, notebook, results_root)
        specs = [s for s in notebook_plan(notebook, params, source) if shown(s, params)]
        matching = [
            s for s in specs if all(v in {str(x) for x in s.labels.values()} for v in values)
        ]
        if not matching:
            known = sorted({str(x) for s in specs for x in s.labels.values()})
            raise ConfigError(
                f"no run of {table} has the labels {', '.join(values) or '(none)'}; its "
                f"labels are: {', '.join(known)}"
            )
        for spec in matching:
            key = run_key(spec.config, source.datasets(spec.config))
            label = " ".join(str(spec.labels[k]) for k in sorted(spec.labels, key="method".__ne__))
            chosen.setdefault(key, f"{label} seed {spec.config.seed}")
    for key in keys:
        chosen.setdefault(_full_key(store, key), "")
    if sample:
        stored = sorted(p.stem for p in store.root.glob("*.json"))
        if sample > len(stored):
            raise ConfigError(f"--sample {sample} exceeds the {len(stored)} runs in {store.root}")
        rng = np.random.default_rng(sample_seed)
        for i in sorted(rng.choice(len(stored), size=sample, replace=False)):
            chosen.setdefault(stored[int(i)], "")
    if not chosen:
        raise ConfigError("name the runs to verify: a table (and labels), --key or --sample")
    out = []
    for key, label in chosen.items():
        record = store.load(key)
        if record is None:
            raise ConfigError(f"run {key} is not in the store {store.root}")
        out.append((record, label or describe(record)))
    return out


def describe(record: dict[str, Any]) -> str:
    """A short label of a record: method, dataset or population, seed."""
    c = record["config"]
    where = c.get("population") or c.get("dataset")
    return f"{c['algorithm']} {where} seed {c['seed']}"


def rerun_setting(record: dict[str, Any]) -> tuple[dict[str, str | None], int, str]:
    """(the environment variables, the thread count, where the record can be checked): how
    `verify` reruns ``record`` as it was made (fedtsp.core.isa.record_environment)."""
    env = record.get("environment") or {}
    variables, where = isa.record_environment(env)
    return variables, int(env.get("threads") or 1), where


def verify(
    chosen: list[tuple[dict[str, Any], str]], source: DataSource, workers: int = 1
) -> list[Check]:
    """Rerun every chosen record's config from scratch, with the record's own CPU kernels
    and thread count (each in a fresh process, whatever ``workers`` is), and compare its
    history."""
    here = cpu_class()
    specs = [RunSpec(RunConfig.from_dict(record["config"])) for record, _ in chosen]
    keys = [run_key(spec.config, source.datasets(spec.config)) for spec in specs]
    settings = [rerun_setting(record) for record, _ in chosen]
    reruns: dict[int, dict[str, Any] | None] = {}
    failed: dict[int, str] = {}
    with tempfile.TemporaryDirectory(prefix="fedtsp-verify-") as tmp:
        groups: dict[tuple, list[int]] = {}
        for i, (variables, threads, _) in enumerate(settings):
            groups.setdefault((tuple(sorted(variables.items())), threads), []).append(i)
        for (variables, threads), members in groups.items():
            executor = LocalExecutor(workers, threads=threads, environment=dict(variables))
            try:
                run_all([specs[i] for i in members], source, tmp, executor=executor)
            except RunsFailed as exc:  # the others finished: report each run for itself
                failed |= dict.fromkeys(members, str(exc).splitlines()[0])
            for i in members:
                reruns[i] = RunStore(tmp).load(keys[i])
    checks = []
    for i, ((record, label), key) in enumerate(zip(chosen, keys, strict=True)):
        recorded_cpu = (record.get("environment") or {}).get("cpu")
        where = settings[i][2]
        check = Check(
            key=record["key"],
            label=label,
            rounds=len(record["history"]),
            code=short_commit(record),
            cpu=("avx2" in here["flags"])
            if where == isa.AVX2_MACHINES
            else same_class(recorded_cpu, here),
            checkable=where,
            new_key=key,
        )
        new = reruns.get(i)
        if new is None:
            check.error = failed.get(i, "no record")
        else:
            check.differences, check.first_round = compare_histories(
                record["history"], new["history"]
            )
        checks.append(check)
    return checks


def run_verify(
    profile_name: str,
    *,
    table: str | None,
    values: Sequence[str],
    keys: Sequence[str],
    sample: int | None,
    sample_seed: int,
    results_root: str | Path,
    workers: int,
    report: str | Path | None = None,
) -> int:
    """The `fedtsp verify` command: exit 0 only when every rerun history is identical."""
    from fedtsp.core.results import code_version

    code = code_version()  # the code that reruns, not whatever is checked out when it ends
    profile = load_profile(profile_name)
    store = RunStore(Path(results_root) / profile.name / "runs")
    if not store.root.is_dir():
        raise ConfigError(f"profile {profile.name!r} has no run store at {store.root}")
    source = DataSource(profile.data, profile.synthetic_per_class)
    chosen = select(
        profile,
        store,
        source,
        results_root,
        table=table,
        values=values,
        keys=keys,
        sample=sample,
        sample_seed=sample_seed,
    )
    print(
        f"verifying {len(chosen)} run(s) of {store.root} with today's code, each with its "
        "record's CPU kernels and thread count"
    )
    checks = verify(chosen, source, workers)
    lines = [c.line() for c in checks]
    lines.append(tally(checks))
    print("\n".join(lines))
    if report is not None:
        asked = (profile.name, table, values, keys, sample, sample_seed)
        write_report(report, checks, *asked, code=code)
    return 0 if all(c.identical for c in checks) else 1


def write_report(
    path: str | Path,
    checks: list[Check],
    profile: str,
    table: str | None,
    values: Sequence[str],
    keys: Sequence[str],
    sample: int | None,
    sample_seed: int,
    code: dict[str, Any],
) -> None:
    """The checks as a Markdown file (for committed evidence); `code`: the code version
    that reran them."""
    from fedtsp.core.atomic import atomic_write_text

    asked = " ".join(
        [f"--profile {profile}"]
        + ([table, *values] if table else [])
        + [f"--key {k}" for k in keys]
        + ([f"--sample {sample} --sample-seed {sample_seed}"] if sample else [])
    )
    here = cpu_class()
    lines = [
        f"# fedtsp verify {asked}",
        "",
        f"Today's code: {short_commit(code)}; this machine: {isa.cpu_words(here)}. Each run "
        "is rerun with its record's CPU kernels and thread count: AVX2-pinned records (and "
        "those made at the AVX2 level) with the AVX2 pins, the others with this machine's own.",
        "",
        "| run | what | recorded by | checkable | here | result |",
        "|---|---|---|---|---|---|",
    ]
    can = {True: "yes", False: "no", None: "unknown"}
    for c in checks:
        lines.append(
            f"| {c.key} | {c.label} | {c.code} | {c.checkable} | {can[c.cpu]} | {c.result()} |"
        )
    lines += ["", tally(checks) + ".", ""]
    atomic_write_text(Path(path), "\n".join(lines))


def tally(checks: list[Check]) -> str:
    """How many reruns matched, and how many records of each kind this machine can check."""
    same = sum(c.identical for c in checks)
    anywhere = sum(c.checkable == isa.AVX2_MACHINES for c in checks)
    here = sum(c.cpu is True for c in checks)
    return (
        f"{same} of {len(checks)} reruns identical to their records; {anywhere} of them "
        f"checkable {isa.AVX2_MACHINES}, {len(checks) - anywhere} only on their own CPU "
        f"class; {here} checkable on this machine"
    )

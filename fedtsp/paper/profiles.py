"""Reproduction profiles (smoke / cpu / paper) read from the versioned `profiles.toml`.

A profile fixes the scale of every notebook: where the data comes from, the seeds, the
RunConfig fields shared by all runs (`base`) and each notebook's own parameters. A
notebook's parameters cell holds only a profile name (default `cpu`) and optional
overrides; it reads everything else through `notebook_parameters(profile, notebook)`, as the
batch runner's plan does, so every value is written once, here.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from fedtsp.core.config import ConfigError, RunConfig

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

PROFILES_FILE = Path(__file__).with_name("profiles.toml")


@dataclass(frozen=True)
class Profile:
    name: str
    about: str
    data: str
    seeds: list[int]
    workers: int
    base: dict[str, Any]
    notebooks: dict[str, dict[str, Any]]
    synthetic_per_class: int = 12
    # What the profile leaves out on purpose (item -> why): reported as planned, not partial.
    planned_skips: dict[str, str] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)


def _read(path: Path = PROFILES_FILE) -> dict[str, Any]:
    """The file's tables, a profile with `inherits = "P"` merged onto profile P's."""
    with open(path, "rb") as fh:
        raw = tomllib.load(fh)
    for name, section in raw.items():
        parent = section.get("inherits") if name != "methods" else None
        if parent is not None:
            if parent not in raw or "inherits" in raw[parent]:
                raise ConfigError(f"profile {name!r} inherits {parent!r}: no such base profile")
            raw[name] = _merged(raw[parent], {k: v for k, v in section.items() if k != "inherits"})
    return raw


def _merged(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """`base` with `override`'s values on top, tables merged key by key."""
    out = dict(base)
    for key, value in override.items():
        both = isinstance(value, dict) and isinstance(out.get(key), dict)
        out[key] = _merged(out[key], value) if both else value
    return out


def analysis_plan_files(profile: Profile) -> list[Path]:
    """The profile's analysis plan files (`fedtsp/paper/claims/<file>`): the plan, then its
    addenda in the order written (none for a profile without a plan)."""
    names = profile.extra.get("analysis_plan", [])
    paths = [
        PROFILES_FILE.parent / "claims" / str(n)
        for n in ([names] if isinstance(names, str) else names)
    ]
    for path in paths:
        if not path.is_file():
            raise ConfigError(
                f"profile {profile.name!r} reads its seeds from the analysis plan {path.name}, "
                "which is missing; write it with: python -m fedtsp.paper.claims.analysis_plan"
            )
    return paths


def analysis_plan_data(profile: Profile) -> dict[str, Any] | None:
    """The profile's analysis plan as committed, its addenda's parts and groups appended
    (a group two files name runs the larger number of seeds), or None without a plan."""
    paths = analysis_plan_files(profile)
    if not paths:
        return None
    plan = json.loads(paths[0].read_text())
    for path in paths[1:]:
        addendum = json.loads(path.read_text())
        plan["parts"] = plan["parts"] + addendum["parts"]
        seeds = group_seeds(plan)
        for group in addendum["groups"]:
            if group["id"] in seeds:
                seeds[group["id"]] = max(seeds[group["id"]], int(group["seeds"]))
            else:
                plan["groups"] = [*plan["groups"], group]
        plan["groups"] = [g | {"seeds": seeds.get(g["id"], g["seeds"])} for g in plan["groups"]]
    return plan


def group_seeds(plan: dict[str, Any]) -> dict[str, int]:
    """Seeds per run group (`experiments.seed_group`) of an analysis plan's data."""
    return {group["id"]: int(group["seeds"]) for group in plan["groups"]}


def planned_seeds(profile: Profile) -> dict[str, int] | None:
    """Seeds per run group of the profile's analysis plan, or None without one."""
    plan = analysis_plan_data(profile)
    return None if plan is None else group_seeds(plan)


def method_specs(path: Path = PROFILES_FILE) -> dict[str, dict[str, Any]]:
    """Method label -> {"algorithm": name, **options}, shared by every profile."""
    return {label: dict(spec) for label, spec in _read(path)["methods"].items()}


def profile_names(path: Path = PROFILES_FILE) -> list[str]:
    return [name for name in _read(path) if name != "methods"]


class Resources(NamedTuple):
    """What one run asks a cluster for (``[P.resources]``): CPU threads, and a share of
    one GPU (a fraction for models too small to fill one)."""

    cpus: float = 1.0
    gpus: float = 0.0

    @property
    def threads(self) -> int:
        return max(int(self.cpus), 1)


def _check_resources(name: str, table: dict[str, Any]) -> None:
    for family, entry in table.items():
        ok = isinstance(entry, dict) and not set(entry) - {"cpus", "gpus"}
        values = [entry.get("cpus", 1), entry.get("gpus", 0)] if ok else []
        ok = ok and all(isinstance(v, int | float) and not isinstance(v, bool) for v in values)
        if not ok or not (values[0] > 0 and 0 <= values[1] <= 1):
            raise ConfigError(
                f"profile {name!r}: resources.{family} = {entry!r} is invalid; give cpus > 0 "
                "and a GPU share in [0, 1], e.g. { cpus = 2, gpus = 0.5 } (a run uses one device)"
            )


def run_resources(profile: Profile, config: RunConfig) -> Resources:
    """What ``config``'s run asks for under ``profile``: its family's entry in
    ``[P.resources]``, else the entry ``default``, else 1 CPU (and 1 GPU on CUDA)."""
    table = profile.extra.get("resources", {})
    entry = table.get(config.family, table.get("default"))
    if entry is None:
        return Resources(1.0, 1.0 if str(config.device).startswith("cuda") else 0.0)
    return Resources(float(entry.get("cpus", 1)), float(entry.get("gpus", 0)))


def _unchecked(config: RunConfig, here: bool = True) -> RunConfig:
    return config


def load_profile(name: str, path: Path = PROFILES_FILE, check_runs: bool = True) -> Profile:
    """The profile `name`, checked: its base config validates and its methods exist.
    ``check_runs=False`` leaves out the checks that need the methods (and torch), for a reader
    of the profile's settings only."""
    if check_runs:
        from fedtsp.engine.runspec import check_run  # imports the methods and torch
    else:
        check_run = _unchecked

    raw = _read(path)
    names = [n for n in raw if n != "methods"]
    if name not in names:
        raise ConfigError(f"unknown profile {name!r}; choose one of {', '.join(names)}")
    section = dict(raw[name])
    try:
        base = section.pop("base", {})
        # Device availability is checked when a run starts, so that e.g. the GPU profile can
        # be read (and its runs planned) on a CPU machine.
        check_run(RunConfig.from_dict(base), here=False)
        profile = Profile(
            name=name,
            about=" ".join(str(section.pop("about")).split()),
            data=str(section.pop("data")),
            seeds=[int(s) for s in section.pop("seeds")],
            workers=int(section.pop("workers", 1)),
            base=base,
            notebooks=section.pop("notebooks", {}),
            synthetic_per_class=int(section.pop("synthetic_per_class", 12)),
            planned_skips={str(k): str(v) for k, v in section.pop("planned_skips", {}).items()},
            extra=section,
        )
    except KeyError as exc:
        raise ConfigError(f"profile {name!r} in {path} lacks the field {exc.args[0]!r}") from None
    _check_resources(name, profile.extra.get("resources", {}))
    known = method_specs(path)
    for notebook, params in profile.notebooks.items():
        # A notebook's own `base` fields go on top of the profile's (one notebook, e.g.
        # Table 3, may need more local training than the rest).
        if "base" in params:
            params["base"] = {**base, **params["base"]}
            try:
                check_run(RunConfig.from_dict(params["base"]), here=False)
            except ConfigError as exc:
                raise ConfigError(f"profile {name!r}, notebook {notebook}: base: {exc}") from None
        for key in ("methods", "hetero_methods"):
            unknown = [m for m in params.get(key, []) if m not in known]
            if unknown:
                raise ConfigError(
                    f"profile {name!r}, notebook {notebook}: unknown method label(s) "
                    f"{', '.join(unknown)}; defined in [methods]: {', '.join(known)}"
                )
    return profile


def notebook_parameters(
    profile: str | Profile,
    notebook: str,
    results_root: str | Path = "results",
    relative_to: str | Path | None = None,
    overrides: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Every value `notebook` uses at `profile` (JSON-serialisable): its one source, read by
    the notebook itself and by the batch runner's plan.

    Run records go to `<results_root>/<profile>/runs`, tables and figures next to them;
    with `relative_to` (the notebook's working folder) those two paths are given relative
    to it, so that the executed copy holds no absolute path of this machine. `overrides`
    replaces values by name (`base` is merged field by field); an unknown name is an error.
    """
    prof = profile if isinstance(profile, Profile) else load_profile(profile)
    if notebook not in prof.notebooks:
        raise ConfigError(
            f"profile {prof.name!r} has no parameters for notebook {notebook!r}; "
            f"it defines: {', '.join(prof.notebooks)}"
        )
    params = {
        "profile": prof.name,
        "about": prof.about,
        "data": prof.data,
        "workers": prof.workers,
        "synthetic_per_class": prof.synthetic_per_class,
        "seeds": list(prof.seeds),
        "base": dict(prof.base),  # replaced by the notebook's merged base where it has one
        "method_options": dict(prof.extra.get("method_options", {})),
        "planned_skips": dict(prof.planned_skips),
        # Seeds per run group where the profile has an analysis plan: a group runs the
        # first n of `seeds` (notebook_runs.notebook_plan), none if the plan gives it none.
        "plan_seeds": planned_seeds(prof),
        "store": _path(Path(results_root).resolve() / prof.name / "runs", relative_to),
        "results_dir": _path(Path(results_root).resolve() / prof.name, relative_to),
        **prof.notebooks[notebook],
    }
    unknown = sorted(set(overrides or {}) - (set(params) - {"profile"}))
    if unknown:
        raise ConfigError(
            f"notebook {notebook} has no parameter(s) {', '.join(unknown)}; "
            f"it uses: {', '.join(k for k in params if k != 'profile')}"
        )
    for name, value in (overrides or {}).items():
        params[name] = {**params["base"], **value} if name == "base" else value
    if "fmcl_arch" in params and not (overrides or {}).get("about"):  # FMCL's own setting
        params["about"] = (
            f"FMCL's own setting at the {prof.name} profile: {fmcl_setting(params)}; "
            f"populations {', '.join(params['populations'])}, "
            f"{params['population_fraction']:.0%} of each dataset's images"
        )
    return params


def schedule(rounds: int, epochs: int) -> str:
    """ "20 rounds x 1 local epoch"."""
    return f"{rounds} rounds x {epochs} local epoch{'s' * (epochs > 1)}"


def fmcl_setting(params: dict[str, Any]) -> str:
    """FMCL's setting in a phrase, from notebook 08's parameters (not the HtFL ones)."""
    rounds = schedule(params["fmcl_rounds"], params["fmcl_local_epochs"])
    return f"{rounds}, {params['num_clients']} clients, {params['fmcl_arch']}"


def _path(path: Path, relative_to: str | Path | None) -> str:
    return str(path) if relative_to is None else os.path.relpath(path, Path(relative_to).resolve())

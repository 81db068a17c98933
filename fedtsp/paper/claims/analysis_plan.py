"""The pre-registered analysis plan of the cpu evidence (profile `evidence`).

    python -m fedtsp.paper.claims.analysis_plan

For every claim part the evidence profile's notebooks judge, the plan fixes before any of
its runs exist: the comparison, with its comparator named in advance (chosen on the pilot's
seeds 100-102 where the pilot ran both sides, else on the cpu profile's screening seeds
0-2, else named from the paper's Table 1: never on the test seeds, 10 and up); the effect of
interest (the paper's own where it gives one, else `UNNUMBERED`); the equivalence margin
(the rule's `MARGINS`); the sd the power is computed from; and the seeds a paired test
needs for `POWER` at level alpha / parts (Holm's worst case, `claims.power`). The budget,
12 hours at 2 workers less the notebooks' own work, is then spent on the parts in the
issue's priority order (`PRIORITY`); a part whose seeds do not fit is "not testable at this
budget" with the seeds it would need, and every group of runs gets the most seeds any
planned part asks of it.

The sd of a part is a one-sided 80 % upper confidence bound (`SD_CONFIDENCE`: a few seeds
measure an sd poorly, and a plan built on a lucky low sd would be underpowered). For a
difference of personal accuracies between two runs of the HtFL setting on one partition
(Table 1, Table 2, Figs. 5 and Table 4), it bounds the pilot's paired differences on that
dataset at the planned schedule, pooled over FedTSP minus FedProto, FedTGP and Local
(AlignFed had not converged): one sd for every such part, with more degrees of freedom
than any one comparison has. For every other part (rho and gap, rounds, the global test
set, top-5, Table 3's settings, FMCL) it bounds the same part's sd on the cpu profile's
seeds 0-2 (20 rounds x 1 epoch); rounds to a target (F9) scale with the schedule, so that
sd is scaled by the ratio of the rounds.

Writes `analysis_plan.json` beside this file (the profile reads each group's seeds from
it) and `results/pilot/analysis_plan.md` for a reader. `check` compares an evidence
profile's outputs with the plan: every judged part planned, every record descended from
the plan's commit.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import tempfile
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
from scipy.stats import chi2

from fedtsp.core.atomic import atomic_write_text
from fedtsp.core.config import ConfigError, RunConfig
from fedtsp.core.paths import REPO_ROOT
from fedtsp.core.results import RunStore, _git
from fedtsp.paper.claims.findings import convergence_comparison, heterogeneity_comparison
from fedtsp.paper.claims.power import (
    OVER_BUDGET,
    PLANNED,
    POWER,
    PlannedPart,
    allocate,
    seeds_needed,
)
from fedtsp.paper.claims.registry import paper_gains
from fedtsp.paper.claims.rule import _EMPTY, ALPHA, MARGINS, NOT_TESTABLE, Finding
from fedtsp.paper.experiments import DataSource, seed_group
from fedtsp.paper.floors import CEILING
from fedtsp.paper.notebook import NOTEBOOKS_DIR, find_notebooks
from fedtsp.paper.notebook_runs import ABLATION_ROWS, AUTHORS_RUNS, LOCAL_ROW, notebook_plan
from fedtsp.paper.profiles import (
    Profile,
    analysis_plan_data,
    analysis_plan_files,
    group_seeds,
    load_profile,
    notebook_parameters,
)
from fedtsp.paper.reported import table1_value

PROFILE = "evidence"
PLAN_FILE = Path(__file__).with_name("analysis_plan.json")
REPORT = REPO_ROOT / "results" / "pilot" / "analysis_plan.md"
PILOT = REPO_ROOT / "results" / "pilot" / "pilot.json"
SCREENING = REPO_ROOT / "results" / "cpu"  # the cpu profile: seeds 0-2, 20 rounds x 1 epoch
BUDGET_HOURS = 12.0
SD_CONFIDENCE = 0.8
# Effect of interest where the paper gives no number: one accuracy point, 0.05 of rho /
# gap / ARI, 5 rounds (a tenth of the schedule).
UNNUMBERED = {"points": 1.0, "": 0.05, "rounds": 5.0}
# The order: F3 / F4, F11, F12 / F10, F5 (with F3 at Dir(0.5) and Dir(1.0)), F9,
# the rest.
PRIORITY = {"F3": 1, "F4": 1, "F11": 2, "F12": 3, "F10": 3, "F5": 4, "F9": 5}
REST = 6
OURS = "FedTSP-MiniLM"
PROTOTYPE = ("FedProto", "FedTGP", "AlignFed")
POOLED = ("FedProto", "FedTGP", "Local")  # the pilot's converged comparisons
# F11's controls in the order the budget serves them: shuffled targets keep the text
# prototypes' exact geometry and remove only which class gets which, the sharpest test of
# "the meaning carries the gain"; simplex keeps equal spread without any text; random last.
CONTROL_ORDER = ("shuffled", "simplex", "random")


# ---------------------------------------------------------------------------------------
# The plan as the notebooks use it


@dataclass(frozen=True)
class AnalysisPlan:
    """The committed plan: its parts and the seeds of each group of runs."""

    parts: tuple[PlannedPart, ...]
    seeds: dict[str, int]

    def rivals(self, claim: str, scope: str) -> list[str]:
        """The comparators fixed for the claim's part(s) at `scope`."""
        return [
            p.comparator
            for p in self.parts
            if (p.claim, p.scope) == (claim, scope) and p.comparator
        ]

    def part(self, claim: str, scope: str, comparison: str) -> PlannedPart | None:
        for p in self.parts:
            if (p.claim, p.scope, p.comparison) == (claim, scope, comparison):
                return p
        return None

    def restrict(self, findings: Iterable[Finding], claims: Iterable[str] = ()) -> list[Finding]:
        """The planned findings only; a part over the budget says so and how many seeds
        it would need. Every part of `claims` the findings lack is added, not testable,
        with why: a part the budget left without runs still shows in the claims table."""
        out, seen = [], set()
        for f in findings:
            part = self.part(f.claim, f.scope, f.comparison)
            if part is None:
                continue
            seen.add(part)
            if part.status != PLANNED:
                f = dataclasses.replace(
                    f, verdict=NOT_TESTABLE, reason=_unplanned(part), tests=(), p_holm=math.nan
                )
            out.append(f)
        claims = set(claims)
        for part in self.parts:
            if part.claim in claims and part not in seen:
                why = (
                    "planned, but no runs of it here"
                    if part.status == PLANNED
                    else _unplanned(part)
                )
                kind = "within" if part.kind == "equivalent" else part.kind
                out.append(
                    Finding(
                        part.claim,
                        part.scope,
                        part.comparison,
                        _EMPTY,
                        NOT_TESTABLE,
                        why,
                        unit=part.unit,
                        margin=part.margin,
                        kind=kind,
                    )
                )
        return out


def _unplanned(part: PlannedPart) -> str:
    """Why a part the plan does not run is not testable (with the seeds it would need)."""
    if part.status != OVER_BUDGET:
        return part.status
    need = "more than 100" if part.seeds is None else str(part.seeds)
    return f"{part.status}: needs {need} seeds"


def load_plan(profile: Profile | str) -> AnalysisPlan | None:
    """The profile's analysis plan (None for a profile without one)."""
    prof = profile if isinstance(profile, Profile) else load_profile(profile)
    data = analysis_plan_data(prof)
    if data is None:
        return None
    parts = tuple(PlannedPart(**{**p, "groups": tuple(p["groups"])}) for p in data["parts"])
    return AnalysisPlan(parts, group_seeds(data))


# ---------------------------------------------------------------------------------------
# Building the plan


@dataclass(frozen=True)
class Group:
    """One group of runs of the profile: a config run once per seed."""

    id: str
    notebook: str  # the first notebook that runs it, and its labels there
    labels: dict[str, Any]
    seconds: float  # estimated wall time of one run at the profile's workers
    # Every (notebook, labels) naming it: notebooks share runs (02 and 06 use Table 1's).
    mentions: tuple[tuple[str, tuple[tuple[str, Any], ...]], ...] = ()


def profile_groups(profile: Profile, workers: int) -> list[Group]:
    """Every group of runs of the profile's notebooks (first mention wins), with the
    estimated wall time of one run (`fedtsp reproduce --plan`'s estimator)."""
    from fedtsp.paper.plan import make_plan  # torch: only when a plan is built

    seed = profile.seeds[0]
    one = dataclasses.replace(
        profile,
        seeds=[seed],
        extra={k: v for k, v in profile.extra.items() if k != "analysis_plan"},
        notebooks={
            nb: {k: [seed] if k in ("seeds", "hetero_seeds") else v for k, v in p.items()}
            for nb, p in profile.notebooks.items()
        },
    )
    notebooks = find_notebooks(NOTEBOOKS_DIR)
    with tempfile.TemporaryDirectory() as empty:
        runs, _ = make_plan(one, notebooks, Path(empty), workers)
    seconds = {seed_group(r.config): r.seconds for r in runs}
    source = DataSource(profile.data, profile.synthetic_per_class)
    groups: dict[str, Group] = {}
    for nb in notebooks:
        for spec in notebook_plan(nb.stem, notebook_parameters(one, nb.stem), source):
            gid = seed_group(spec.config)
            if gid not in groups:
                if seconds.get(gid) is None:
                    raise ConfigError(f"no cost estimate for {nb.stem} {spec.labels}")
                groups[gid] = Group(gid, nb.stem, dict(spec.labels), float(seconds[gid]))
            mention = (nb.stem, tuple(spec.labels.items()))
            groups[gid] = dataclasses.replace(
                groups[gid], mentions=(*groups[gid].mentions, mention)
            )
    return list(groups.values())


def find(groups: Sequence[Group], notebook: str, **labels: Any) -> str:
    """The id of the one group of `notebook` whose labels include `labels`."""
    found = {
        g.id
        for g in groups
        for nb, named in g.mentions
        if nb == notebook and all(dict(named).get(k) == v for k, v in labels.items())
    }
    if len(found) != 1:
        raise ConfigError(f"{len(found)} groups of {notebook} match {labels}")
    return found.pop()


def upper_sd(sd: float, df: int) -> float:
    """The one-sided `SD_CONFIDENCE` upper confidence bound of an sd measured with `df`
    degrees of freedom."""
    return sd * math.sqrt(df / chi2.ppf(1 - SD_CONFIDENCE, df))


def pilot_inputs(pilot: dict[str, Any]) -> dict[str, Any]:
    """From pilot.json: the pooled paired sd per dataset at the full schedule (and its df),
    and each dataset's strongest baselines by mean best accuracy."""
    rounds = pilot["setting"]["rounds"]
    pooled = {}
    for ds in pilot["setting"]["datasets"]:
        rows = [
            d
            for d in pilot["paired_differences"]
            if d["rounds"] == rounds and d["value"] == "best" and d["dataset"] == ds
            and d["comparison"].split(" - ")[1] in POOLED and d["n"] > 1
        ]  # fmt: skip
        df = sum(d["n"] - 1 for d in rows)
        var = sum((d["n"] - 1) * d["sd"] ** 2 for d in rows) / df
        pooled[ds] = (math.sqrt(var), df)
    best: dict[str, dict[str, float]] = defaultdict(dict)
    for m in pilot["methods"]:
        best[m["dataset"]][m["method"]] = m["best_acc"]
    return {"pooled": pooled, "best": best, "methods": pilot["setting"]["methods"]}


def _strongest(means: dict[str, float], among: Iterable[str]) -> str:
    return max((m for m in among if m in means), key=lambda m: means[m])


def screening(results: Path = SCREENING) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The cpu profile's claims (seeds 0-2) and its Table 1 means."""
    claims = pd.read_csv(results / "claims.csv")
    table = pd.read_csv(results / "tables" / "table1_accuracy.csv")
    return claims, table


def build_parts(
    groups: Sequence[Group],
    pilot: dict[str, Any],
    claims: pd.DataFrame,
    table1: pd.DataFrame,
    rounds_ratio: float,
) -> list[PlannedPart]:
    """Every part the evidence notebooks judge, with comparator, effect, margin, sd and
    seeds for `POWER` (before the budget). `rounds_ratio`: the planned schedule's rounds
    over the screening runs' (F9's rounds to a target scale with it)."""
    gains = paper_gains()
    p = pilot_inputs(pilot)
    specs: list[dict[str, Any]] = []

    def screened(claim: str, scope: str) -> pd.Series | None:
        rows = claims[(claims["claim"] == claim) & (claims["scope"] == scope)]
        return None if rows.empty else rows.iloc[0]

    def rival_of(row: pd.Series | None) -> str:
        return str(row["comparison"]).split(" - ")[1].split(" (strongest")[0]

    def add(claim, scope, comparison, unit, groups_, kind="above", effect=None, sd_from=None,
            dataset=None, comparator="", basis="", pooled_scale=1.0, cpu_scale=1.0,
            priority=None):  # fmt: skip
        sds, notes = [], []
        if dataset in p["pooled"] and unit == "points":
            sd, df = p["pooled"][dataset]
            sds.append(upper_sd(sd * pooled_scale, df))
            notes.append(f"pilot pooled {sd * pooled_scale:.2f} (df {df})")
        elif sd_from is not None and not pd.isna(sd_from["std"]) and sd_from["n"] > 1:
            sd = float(sd_from["std"]) * cpu_scale
            sds.append(upper_sd(sd, int(sd_from["n"]) - 1))
            notes.append(f"seeds 0-2 {sd:.2f} (df {int(sd_from['n']) - 1})")
        # An sd measured as 0 (the same clusters on every seed) is taken as a tenth of the
        # margin: three seeds cannot show that it is 0.
        floor = MARGINS[unit] / 10
        specs.append(
            {
                "claim": claim, "scope": scope, "comparison": comparison, "kind": kind,
                "effect": UNNUMBERED[unit] if effect is None else effect,
                "margin": MARGINS[unit], "sd": max(*sds, floor) if sds else math.nan,
                "groups": tuple(dict.fromkeys(groups_)),
                "priority": PRIORITY.get(claim, REST) if priority is None else priority,
                "comparator": comparator,
                "unit": unit, "note": "; ".join([basis, *notes]).strip("; "),
            }
        )  # fmt: skip

    def main(ds: str, alpha: float, method: str, family: str = "htfe-cpu") -> str:
        return find(groups, "03_main_table", dataset=ds, alpha=alpha, method=method, family=family)

    datasets = ("cifar10", "cifar100")
    others = [m for m in dict.fromkeys(table1["method"]) if m not in p["methods"]]
    f3_rivals = {}
    for ds in datasets:
        rows = table1[(table1["dataset"] == ds) & (table1["alpha"] == 0.1)]
        screen_means = {
            str(r.method): float(r.mean) for r in rows.itertuples() if r.method in others
        }
        for alpha in (0.1, 0.5, 1.0):
            scope = f"{ds}, Dir({alpha:g})"
            if alpha == 0.1:
                rival = _strongest(p["best"][ds], PROTOTYPE)
                basis = "comparator: the strongest prototype baseline on the pilot"
            else:
                rival = max(PROTOTYPE, key=lambda m: table1_value(m, ds, alpha) or -1.0)
                basis = "comparator: the strongest prototype baseline of the paper's Table 1"
            f3_rivals[(ds, alpha)] = rival
            add("F3", scope, f"{OURS} - {rival}", "points",
                [main(ds, alpha, OURS), main(ds, alpha, rival)], effect=gains[(ds, alpha)],
                sd_from=screened("F3", scope), dataset=ds, comparator=rival, basis=basis,
                priority=None if alpha == 0.1 else PRIORITY["F5"])  # fmt: skip
            if alpha != 0.1:
                continue
            pilot_rival = _strongest(p["best"][ds], [m for m in p["methods"] if m != OURS])
            screen_rival = _strongest(screen_means, others)
            for rival, basis in (
                (pilot_rival, "comparator: the strongest pilot baseline on the pilot"),
                (screen_rival, "comparator: the strongest other Table 1 baseline on seeds 0-2"),
            ):
                add("F4", scope, f"{OURS} - {rival}", "points",
                    [main(ds, alpha, OURS), main(ds, alpha, rival)],
                    effect=gains[(ds, alpha)], sd_from=screened("F4", scope), dataset=ds,
                    comparator=rival, basis=basis + "; effect: the paper's gain over the "
                    "prototype baselines (its other baselines' numbers are not in the package)")  # fmt: skip
            for claim, unit in (("F7", "points"), ("F8", "points")):
                row = screened(claim, scope)
                if row is None:
                    continue
                rival = rival_of(row)
                status = ""
                if claim == "F8" and "ceiling" in str(row["reason"]):
                    status = f"{NOT_TESTABLE}: top-5 above the {CEILING:g} % ceiling on seeds 0-2"
                add(claim, scope, f"{OURS} - {rival}", unit,
                    [main(ds, alpha, OURS), main(ds, alpha, rival)], sd_from=row,
                    comparator=rival, basis="comparator: the strongest on seeds 0-2")  # fmt: skip
                if status:
                    specs[-1]["status"] = status
            rival = f3_rivals[(ds, 0.1)]
            add("F9", scope, convergence_comparison(rival, OURS), "rounds",
                [main(ds, alpha, OURS), main(ds, alpha, rival)],
                sd_from=screened("F9", scope), comparator=rival, cpu_scale=rounds_ratio,
                basis=f"comparator: F3's; sd: seeds 0-2's scaled by {rounds_ratio:g}x the rounds")  # fmt: skip
        effect = gains[(ds, 0.1)] - gains[(ds, 1.0)]
        add("F5", ds, heterogeneity_comparison(OURS, 0.1, 1.0), "points",
            [main(ds, a, m) for a in (0.1, 1.0) for m in (OURS, f3_rivals[(ds, a)])],
            effect=effect, dataset=ds, pooled_scale=math.sqrt(2),
            comparator=f"{f3_rivals[(ds, 0.1)]} / {f3_rivals[(ds, 1.0)]}",
            basis="F3's comparators; sd: two independent paired gains")  # fmt: skip
    for family in ("htfe2-cpu", "htfe3-cpu", "htfe-cpu"):
        scope = f"{family}, cifar10"
        row = screened("F6", scope)
        rival = rival_of(row)
        add("F6", scope, f"{OURS} - {rival}", "points",
            [main("cifar10", 0.1, OURS, family), main("cifar10", 0.1, rival, family)],
            sd_from=row, dataset="cifar10", comparator=rival,
            basis="comparator: the strongest on seeds 0-2")  # fmt: skip
    for ds in datasets:
        sem = [find(groups, "02_prototype_semantics", dataset=ds, method=OURS)]
        for claim in ("F1", "F2"):
            row = screened(claim, ds)
            rival = rival_of(row)
            rival_group = find(groups, "02_prototype_semantics", dataset=ds, method=rival)
            add(claim, ds, f"{OURS} - {rival}", "", [*sem, rival_group], sd_from=row,
                comparator=rival, basis="comparator: the strongest on seeds 0-2")  # fmt: skip
            untrained = claims[(claims["claim"] == claim) & (claims["scope"] == ds)
                               & claims["comparison"].str.contains("untrained")].iloc[0]  # fmt: skip
            add(claim, ds, str(untrained["comparison"]), "", sem, sd_from=untrained,
                basis="the encoder's own prototypes before training")  # fmt: skip
    ablation = claims[claims["claim"].isin(["F10", "F11"])]
    ablation = ablation.assign(
        order=[
            CONTROL_ORDER.index(_control(c)) if _control(c) else 0 for c in ablation["comparison"]
        ]
    ).sort_values(["claim", "order"], kind="stable")
    for row in ablation.itertuples():
        encoder, ds = str(row.scope).split(", ")
        labels = _ablation_labels(str(row.claim), str(row.comparison))
        ids = [find(groups, "04_ablations", text_encoder=encoder, dataset=ds, **lab)
               for lab in labels]  # fmt: skip
        add(str(row.claim), str(row.scope), str(row.comparison), "points", ids,
            kind="equivalent" if row.claim == "F11" else "above",
            sd_from=claims.loc[row.Index], dataset=ds,
            basis="F11: powered to call a true 0 equivalent" if row.claim == "F11" else "")  # fmt: skip
    for row in claims[claims["claim"] == "F12"].itertuples():
        upper, lower = str(row.comparison).split(" - ")
        ids = [find(groups, "04_ablations", part="fig5", dataset=row.scope, prompts=v)
               for v in (upper, lower)]  # fmt: skip
        add("F12", str(row.scope), str(row.comparison), "points", ids,
            sd_from=claims.loc[row.Index], dataset=str(row.scope))  # fmt: skip
    for row in claims[claims["claim"] == "F13"].itertuples():
        desc = str(row.comparison).split(" ")[0]
        ids = [find(groups, "05_llm_robustness", dataset=row.scope, description_set=d)
               for d in (desc, "long")]  # fmt: skip
        add("F13", str(row.scope), str(row.comparison), "points", ids, kind="equivalent",
            sd_from=claims.loc[row.Index], dataset=str(row.scope),
            basis="powered to call a true 0 within the margin")  # fmt: skip
    for row in claims[claims["claim"] == "F14"].itertuples():
        ds, eps = str(row.scope).split(", epsilon ")
        ids = [find(groups, "06_dp", dataset=ds, epsilon=e) for e in (float(eps), None)]
        add("F14", str(row.scope), str(row.comparison), "points", ids,
            effect=MARGINS["points"], sd_from=claims.loc[row.Index], dataset=ds,
            basis="costs little: powered to clear -margin when the true cost is 0")  # fmt: skip
    for row in claims[claims["claim"] == "F17"].itertuples():
        ids = [find(groups, "04_ablations", part="authors", dataset=row.scope, method=m)
               for m in AUTHORS_RUNS]  # fmt: skip
        add("F17", str(row.scope), str(row.comparison), "points", ids, kind="equivalent",
            sd_from=claims.loc[row.Index], dataset=str(row.scope),
            basis="barely changes: powered to call a true 0 within the margin")  # fmt: skip
    for claim, block, ours in (("F15", "GFL", "FedTSP-GFL"), ("F16", "PFL", "FedTSP-FT")):
        scope = f"{block}, cifar100"
        row = screened(claim, scope)
        rival = rival_of(row)
        ids = [find(groups, "07_homogeneous", block=block, method=m) for m in (ours, rival)]
        add(claim, scope, f"{ours} - {rival}", "points", ids, sd_from=row,
            comparator=rival, basis="comparator: the strongest on seeds 0-2")  # fmt: skip
    for row in claims[claims["claim"].str.startswith("M")].itertuples():
        rival = rival_of(pd.Series({"comparison": row.comparison}))
        ids = [find(groups, "08_fmcl", population=row.scope, method=m) for m in ("fmcl", rival)]
        unit = "" if row.claim == "M2" else "points"
        add(str(row.claim), str(row.scope), f"fmcl - {rival}", unit, ids,
            sd_from=claims.loc[row.Index], comparator=rival,
            basis="comparator: the strongest on seeds 0-2" if row.claim != "M3" else "")  # fmt: skip
    parts_per_claim: dict[str, int] = defaultdict(int)
    for s in specs:
        parts_per_claim[s["claim"]] += 1
    out = []
    for s in specs:
        status = s.pop("status", "")
        unit = s.pop("unit")
        note = s.pop("note")
        seeds = (
            None
            if status or not s["effect"] > 0 or math.isnan(s["sd"])
            else seeds_needed(
                s["kind"], s["sd"], s["effect"], s["margin"], parts_per_claim[s["claim"]]
            )  # fmt: skip
        )
        if not status and not s["effect"] > 0:
            status = (f"{NOT_TESTABLE}: the paper's own Table 1 gives this effect as "
                      f"{s['effect']:+.2f}")  # fmt: skip
        out.append(PlannedPart(**s, seeds=seeds, status=status, unit=unit, note=note))
    return out


def _control(comparison: str) -> str:
    """The semantic control an F11 comparison names ("" for any other)."""
    return comparison.split(" - ")[1].split(" targets")[0] if "targets" in comparison else ""


def _ablation_labels(claim: str, comparison: str) -> list[dict[str, Any]]:
    """The 04 notebook's labels of the two sides of an F10 / F11 part."""
    rows = {label[:3]: label for label in [LOCAL_ROW, *(r[0] for r in ABLATION_ROWS)]}
    if claim == "F10":
        upper, lower = comparison.split(" - ")
        return [{"part": "table2", "row": rows[upper]}, {"part": "table2", "row": rows[lower]}]
    control = _control(comparison)
    return [{"part": "table2", "row": rows["(2)"]}, {"part": "controls", "control": control}]


def budget_seconds(profile: Profile, longest: float = 0.0, hours: float = BUDGET_HOURS) -> float:
    """Run-seconds (all workers together) the budget leaves after the notebooks' own work
    and after `longest`, a run's wall time (the last run may leave the other workers idle
    for up to that long). The notebooks' work is the committed measurement of a cpu
    reproduction from the committed store (`benchmarks/results/reproduce_times.json`)."""
    timings = REPO_ROOT / "benchmarks" / "results" / "reproduce_times.json"
    measured = json.loads(timings.read_text())["profiles"][SCREENING.name]
    notebooks = measured["seconds"] - measured["runs_seconds"]
    return (hours * 3600 - notebooks) * profile.workers - longest * (profile.workers - 1)


def _all_parts(profile: Profile) -> tuple[list[Group], list[PlannedPart]]:
    """The profile's groups of runs and every part its notebooks judge, before the budget."""
    groups = profile_groups(profile, profile.workers)
    pilot = json.loads(PILOT.read_text())
    claims, table1 = screening()
    screened_rounds = load_profile(SCREENING.name).base["rounds"]
    parts = build_parts(groups, pilot, claims, table1, profile.base["rounds"] / screened_rounds)
    return groups, parts


def build_plan(profile_name: str = PROFILE) -> dict[str, Any]:
    """The plan as written to `PLAN_FILE`."""
    profile = load_profile(profile_name)
    groups, parts = _all_parts(profile)
    # Costs are per run at the profile's workers; the budget is in all workers' seconds.
    seconds = {g.id: g.seconds for g in groups}
    return _allocated(profile, groups, parts, budget_seconds(profile, max(seconds.values())))


def build_addendum(scope: str, hours: float, profile_name: str = PROFILE) -> dict[str, Any]:
    """An addendum to the committed plan: the parts at `scope` (a population or dataset the
    plan predates, or a claim it predates) that the plan lacks, planned from today's screening runs within `hours`
    at the profile's workers. The plan itself is left as it is: its records keep their
    standing, and the addendum's groups are judged only on runs made after its commit."""
    profile = load_profile(profile_name)
    groups, parts = _all_parts(profile)
    planned = {
        (p["claim"], p["scope"], p["comparison"])
        for p in json.loads(PLAN_FILE.read_text())["parts"]
    }
    new = [
        p
        for p in parts
        if scope in (p.scope, p.claim) and (p.claim, p.scope, p.comparison) not in planned
    ]
    if not new:
        raise ConfigError(f"no part of scope or claim {scope!r} is missing from {PLAN_FILE.name}")
    used = {g for p in new for g in p.groups}
    groups = [g for g in groups if g.id in used]
    longest = max(g.seconds for g in groups)
    budget = hours * 3600 * profile.workers - longest * (profile.workers - 1)
    # Seeds the committed plan and addenda already run are paid for: only more cost here.
    paid = {g: n for g, n in group_seeds(analysis_plan_data(profile)).items() if g in used}
    return {"addendum_to": PLAN_FILE.name, "scope": scope} | _allocated(
        profile, groups, new, budget, hours, paid
    )


def _allocated(
    profile: Profile,
    groups: list[Group],
    parts: list[PlannedPart],
    budget: float,
    hours: float = BUDGET_HOURS,
    paid: dict[str, int] | None = None,
) -> dict[str, Any]:
    """The plan's file content: `parts` given seeds within `budget` run-seconds (`paid`:
    seeds an earlier plan already runs, which cost nothing here)."""
    seconds = {g.id: g.seconds for g in groups}
    # A part needing more seeds than its notebook lists cannot be run, whatever the budget.
    listed = {g.id: len(notebook_parameters(profile, g.notebook)["seeds"]) for g in groups}
    parts = [
        dataclasses.replace(
            p,
            status=f"{NOT_TESTABLE}: needs {p.seeds} seeds, more than the "
            f"{min(listed[g] for g in p.groups)} the profile lists",
        )
        if not p.status and p.seeds is not None and p.seeds > min(listed[g] for g in p.groups)
        else p
        for p in parts
    ]
    testable = [p for p in parts if not p.status]
    paid = paid or {}
    allocated, seeds = allocate(testable, seconds, budget, paid=paid)
    by_key = {(p.claim, p.scope, p.comparison): p for p in allocated}
    parts = [by_key.get((p.claim, p.scope, p.comparison), p) for p in parts]
    spent = sum(max(n - paid.get(g, 0), 0) * seconds[g] for g, n in seeds.items())
    return {
        "profile": profile.name,
        "schedule": {k: profile.base[k] for k in ("rounds", "local_epochs")},
        "seeds": profile.seeds,
        "power": POWER,
        "alpha": ALPHA,
        "sd_confidence": SD_CONFIDENCE,
        "budget_hours": hours,
        "workers": profile.workers,
        "budget_run_seconds": round(budget, 1),
        "planned_run_seconds": round(spent, 1),
        "parts": [_part_json(p) for p in parts],
        "groups": [
            {
                "id": g.id,
                "notebook": g.notebook,
                "labels": g.labels,
                "seconds": round(g.seconds, 1),
                "seeds": seeds.get(g.id, 0),
            }
            | ({"paid": paid[g.id]} if paid.get(g.id) else {})
            for g in groups
        ],
    }


def _part_json(p: PlannedPart) -> dict[str, Any]:
    out = dataclasses.asdict(p)
    out["groups"] = list(p.groups)
    for key in ("effect", "margin", "sd"):
        out[key] = None if math.isnan(out[key]) else round(out[key], 4)
    return out


def report(plan: dict[str, Any]) -> str:
    """analysis_plan.md (or an addendum's page): the plan for a reader."""
    hours = plan["planned_run_seconds"] / plan["workers"] / 3600
    budget = plan["budget_run_seconds"] / plan["workers"] / 3600
    if "addendum_to" in plan:
        title = f"Addendum to the analysis plan: {plan['scope']} (profile `{plan['profile']}`)"
        written = (
            f"`python -m fedtsp.paper.claims.analysis_plan --addendum {plan['scope']}` from "
            f"the cpu profile's screening runs (seeds 0-2), after the plan ({plan['addendum_to']}, "
            "unchanged) and before any run of the seeds it adds"
        )
    else:
        title = "Analysis plan of the cpu evidence (profile `evidence`)"
        written = (
            "`python -m fedtsp.paper.claims.analysis_plan` from the pilot "
            "(`results/pilot/pilot.json`) and the cpu profile's screening runs (seeds 0-2), "
            "before any run of the profile"
        )
    less = "less one run's length" if "addendum_to" in plan else "less the notebooks' own work"
    lines = [
        f"# {title}",
        "",
        f"Written by {written}. Every part below is judged on the profile's seeds "
        f"(from {plan['seeds'][0]} up) at {plan['schedule']['rounds']} rounds x "
        f"{plan['schedule']['local_epochs']} local epochs; seeds per part: the fewest for "
        f"{plan['power']:.0%} power at level {plan['alpha']:g} / parts of the claim (Holm's "
        f"worst case), from the sd's one-sided {plan['sd_confidence']:.0%} upper bound.",
        "",
        f"Budget: {plan['budget_hours']:g} h at {plan['workers']} workers {less} = "
        f"{budget:.1f} h of runs; planned: {hours:.1f} h.",
        "",
        "| claim | scope | comparison | kind | effect of interest | margin | sd (planned) "
        "| seeds | status | basis |",
        "|---|---|---|---|---:|---:|---:|---:|---|---|",
    ]

    def num(v: float | None, fmt: str = "{:.2f}") -> str:
        return "-" if v is None else fmt.format(v)

    for p in plan["parts"]:
        lines.append(
            f"| {p['claim']} | {p['scope']} | {p['comparison']} | {p['kind']} | "
            f"{num(p['effect'], '{:+.2f}')} | {num(p['margin'])} | {num(p['sd'])} | "
            f"{'> 100' if p['seeds'] is None else p['seeds']} | {p['status'] or '-'} | "
            f"{p['note'] or '-'} |"
        )
    run = [g for g in plan["groups"] if g["seeds"]]
    lines += [
        "",
        f"## Groups of runs ({len(run)} of {len(plan['groups'])} run)",
        "",
    ]
    # An addendum's group may share runs with the plan: those it does not pay for.
    shared = "addendum_to" in plan and any(g.get("paid") for g in plan["groups"])
    if shared:
        lines += [
            "| notebook | group | seeds | of them run by the plan | est. per run (min) |",
            "|---|---|---:|---:|---:|",
        ]
    else:
        lines += ["| notebook | group | seeds | est. per run (min) |", "|---|---|---:|---:|"]
    for g in plan["groups"]:
        labels = ", ".join(str(v) for v in g["labels"].values())
        paid = f" {g.get('paid', 0)} |" if shared else ""
        lines.append(
            f"| {g['notebook']} | {labels} | {g['seeds']} |{paid} {g['seconds'] / 60:.1f} |"
        )
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------
# Checking outputs against the plan


def plan_commit(*paths: Path) -> str | None:
    """The commit that last changed any of the plan files (default: the plan itself)."""
    return _git(["log", "-1", "--format=%H", "--", *map(str, paths or (PLAN_FILE,))], REPO_ROOT)


def addendum_commits(profile: Profile | str) -> dict[str, tuple[str | None, frozenset[int]]]:
    """Group id -> (the commit of the addendum that gave it seeds, the seeds it added: those
    beyond what an earlier plan already ran), over the profile's addenda."""
    prof = profile if isinstance(profile, Profile) else load_profile(profile)
    out: dict[str, tuple[str | None, frozenset[int]]] = {}
    for path in analysis_plan_files(prof)[1:]:
        commit = plan_commit(path)
        for group in json.loads(path.read_text())["groups"]:
            seeds = notebook_parameters(prof, group["notebook"])["seeds"]
            added = seeds[group.get("paid", 0) : group["seeds"]]
            if added:
                out[group["id"]] = (commit, frozenset(added))
    return out


def check(
    results_dir: Path,
    plan: AnalysisPlan,
    commit: str | None,
    addenda: dict[str, tuple[str | None, frozenset[int]]] | None = None,
) -> list[str]:
    """What in a planned profile's outputs breaks the plan: a judged part it lacks, a
    planned part not judged, a record whose code does not descend from `commit`, or, for
    a seed an addendum added to a group (`addenda`: group id -> its commit and the seeds
    it added), from the addendum's."""
    problems = []
    csv = results_dir / "claims.csv"
    if csv.is_file():
        judged = pd.read_csv(csv)
        keys = {(str(r.claim), str(r.scope), str(r.comparison)) for r in judged.itertuples()}
        for claim, scope, comparison in sorted(keys):
            if plan.part(claim, scope, comparison) is None:
                problems.append(
                    f"claims.csv judges an unplanned part: {claim} {scope}: {comparison}"
                )
        for p in plan.parts:
            if (p.claim, p.scope, p.comparison) not in keys:
                problems.append(f"planned part not judged: {p.claim} {p.scope}: {p.comparison}")
    runs = results_dir / "runs"
    if runs.is_dir():
        for record in RunStore(runs).records():
            code = record.get("git_commit")
            needed, what = commit, "plan"
            if addenda and "config" in record:  # (an addendum's commit descends from the plan's)
                group = seed_group(RunConfig.from_dict(record["config"]))
                added, seeds = addenda.get(group, (None, frozenset()))
                if record["config"].get("seed") in seeds:
                    needed, what = added, "addendum"
            if needed is None or code is None or not _descends(code, needed):
                problems.append(f"run {record.get('key')} comes from code {code}, not after "
                                f"the {what}'s commit {needed}")  # fmt: skip
    return problems


def _descends(code: str, ancestor: str) -> bool:
    return _git(["merge-base", "--is-ancestor", ancestor, code], REPO_ROOT) is not None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m fedtsp.paper.claims.analysis_plan", description=__doc__
    )
    parser.add_argument(
        "--replace",
        action="store_true",
        help="overwrite the committed plan (it is pre-registered: records made before the "
        "new plan's commit no longer count)",
    )
    parser.add_argument(
        "--addendum",
        metavar="SCOPE",
        help="plan the parts at SCOPE (a population or dataset added after the plan, or a "
        "claim id such as F17) that the plan lacks, in an addendum file of their own; the "
        "plan is left unchanged",
    )
    parser.add_argument(
        "--hours", type=float, default=1.0, help="--addendum: its budget (default 1 h)"
    )
    args = parser.parse_args(argv)
    path, page = PLAN_FILE, REPORT
    if args.addendum:
        name = f"analysis_plan_{args.addendum.replace('-', '_').lower()}"
        path, page = PLAN_FILE.with_name(f"{name}.json"), REPORT.with_name(f"{name}.md")
    if path.is_file() and not args.replace:
        print(
            f"{path.name} exists and is pre-registered: its runs are judged by it. "
            "Rebuilding it from today's inputs may change it; pass --replace to do so anyway.",
            file=sys.stderr,
        )
        return 2
    plan = build_addendum(args.addendum, args.hours) if args.addendum else build_plan()
    atomic_write_text(path, json.dumps(plan, indent=1) + "\n")
    atomic_write_text(page, report(plan))
    planned = sum(p["status"] == PLANNED for p in plan["parts"])
    print(
        f"{planned} of {len(plan['parts'])} parts planned; runs: "
        f"{plan['planned_run_seconds'] / plan['workers'] / 3600:.1f} h of "
        f"{plan['budget_run_seconds'] / plan['workers'] / 3600:.1f} h; wrote {path.name} "
        f"and {page.relative_to(REPO_ROOT)}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

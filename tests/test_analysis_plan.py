"""The pre-registered analysis plan: seeds from power, a budget, comparators fixed in
advance, and outputs held to the plan."""

from __future__ import annotations

import json
import math
import subprocess
from collections import defaultdict

import pandas as pd
import pytest

from fedtsp.core.paths import REPO_ROOT
from fedtsp.paper.claims import NOT_TESTABLE, homogeneous, semantics
from fedtsp.paper.claims.analysis_plan import (
    PLAN_FILE,
    PLANNED,
    AnalysisPlan,
    addendum_commits,
    budget_seconds,
    check,
    load_plan,
    plan_commit,
    upper_sd,
)
from fedtsp.paper.claims.power import PlannedPart
from fedtsp.paper.experiments import DataSource, seed_group
from fedtsp.paper.notebook import NOTEBOOKS_DIR, find_notebooks
from fedtsp.paper.notebook_runs import notebook_plan
from fedtsp.paper.profiles import (
    analysis_plan_data,
    analysis_plan_files,
    group_seeds,
    load_profile,
    notebook_parameters,
    profile_names,
)

PLAN = json.loads(PLAN_FILE.read_text())


def _part(claim: str, scope: str, comparison: str, comparator: str, **kw) -> PlannedPart:
    fields = dict(kind="above", effect=1.0, margin=1.0, sd=0.5, seeds=4, groups=("g",),
                  priority=1, status=PLANNED, unit="")  # fmt: skip
    return PlannedPart(claim, scope, comparison, comparator=comparator, **{**fields, **kw})


def test_upper_sd_is_the_one_sided_80_percent_bound():
    # Three seeds (df 2): chi2(0.2; 2) = 0.4463, so the bound is sd x 2.117.
    assert upper_sd(1.0, 2) == pytest.approx(2.117, abs=1e-3)
    assert upper_sd(1.0, 60) == pytest.approx(1.088, abs=1e-3)  # many seeds: near the sd


def test_each_group_gets_the_most_seeds_a_planned_part_asks_and_the_budget_holds():
    need: dict[str, int] = defaultdict(int)
    for part in PLAN["parts"]:
        if part["status"] == PLANNED:
            for g in part["groups"]:
                need[g] = max(need[g], part["seeds"])
        else:
            assert part["status"], part  # every part says why it is not planned
    seeds = {g["id"]: g["seeds"] for g in PLAN["groups"]}
    assert {g: n for g, n in seeds.items() if n} == dict(need)
    spent = sum(g["seeds"] * g["seconds"] for g in PLAN["groups"])
    assert spent == pytest.approx(PLAN["planned_run_seconds"], abs=10)  # seconds rounded
    assert spent <= PLAN["budget_run_seconds"] <= 12 * 3600 * PLAN["workers"]
    # F3 and F4 at Dir(0.1), the first priority, are planned on both datasets.
    first = [p for p in PLAN["parts"] if p["claim"] in ("F3", "F4") and "Dir(0.1)" in p["scope"]]
    assert {p["scope"] for p in first} == {"cifar10, Dir(0.1)", "cifar100, Dir(0.1)"}
    assert all(p["status"] == PLANNED for p in first)


def test_the_profile_runs_the_planned_seeds_of_each_group():
    profile = load_profile("evidence")
    source = DataSource(profile.data)
    counted: dict[str, set[int]] = defaultdict(set)
    for nb in find_notebooks(NOTEBOOKS_DIR):
        for spec in notebook_plan(nb.stem, notebook_parameters(profile, nb.stem), source):
            counted[seed_group(spec.config)].add(spec.config.seed)
    planned = {g: n for g, n in group_seeds(analysis_plan_data(profile)).items() if n}
    assert {g: len(s) for g, s in counted.items()} == planned  # the plan's and its addendum's
    assert all(sorted(s) == list(range(10, 10 + len(s))) for s in counted.values())  # first n
    assert min(profile.seeds) >= 10  # apart from the pilot (100-102) and screening (0-2)


def test_a_fixed_comparator_is_used_even_where_another_rival_is_stronger():
    sem = pd.DataFrame(
        [
            {"dataset": "cifar10", "method": m, "seed": s, "rho": v + 0.01 * s, "gap": 0.1}
            for s in (10, 11, 12)
            for m, v in (("FedTSP-MiniLM", 0.7), ("FedTGP", 0.6), ("FedProto", 0.3))
        ]
    )
    free = semantics(sem)
    assert [f.comparison for f in free if f.claim == "F1"] == [
        "FedTSP-MiniLM - FedTGP (strongest of 2)"
    ]
    plan = AnalysisPlan(
        (
            _part("F1", "cifar10", "FedTSP-MiniLM - FedProto", "FedProto"),
            _part("F2", "cifar10", "FedTSP-MiniLM - FedTGP", "FedTGP", seeds=30,
                  status="not testable at this budget"),
        ),
        {},
    )  # fmt: skip
    found = {f.claim: f for f in semantics(sem, plan=plan)}
    assert set(found) == {"F1", "F2"}  # unplanned parts are not judged
    assert found["F1"].comparison == "FedTSP-MiniLM - FedProto"
    assert found["F1"].effect.mean == pytest.approx(40.0 / 100, abs=1e-9)
    assert found["F2"].verdict == NOT_TESTABLE
    assert found["F2"].reason == "not testable at this budget: needs 30 seeds"
    # A part the plan found not testable for another reason says that reason only.
    ceiling = "not testable here: top-5 above the 95 % ceiling on seeds 0-2"
    plan = AnalysisPlan((_part("F1", "cifar10", "FedTSP-MiniLM - FedProto", "FedProto",
                               status=ceiling, seeds=None),), {})  # fmt: skip
    assert [f.reason for f in semantics(sem, plan=plan)] == [ceiling]
    assert math.isnan(found["F2"].p_holm)


def test_every_part_of_a_judged_claim_shows_even_where_the_plan_gave_it_no_runs():
    sem = pd.DataFrame(
        [
            {"dataset": "cifar10", "method": m, "seed": s, "rho": v + 0.01 * s, "gap": 0.1}
            for s in (10, 11, 12)
            for m, v in (("FedTSP-MiniLM", 0.7), ("FedTGP", 0.6))
        ]
    )
    plan = AnalysisPlan(
        (
            _part("F1", "cifar10", "FedTSP-MiniLM - FedTGP", "FedTGP"),
            _part("F1", "cifar100", "FedTSP-MiniLM - FedTGP", "FedTGP", seeds=51,
                  status="not testable at this budget"),
            _part("F2", "cifar100", "FedTSP-MiniLM - FedTGP", "FedTGP"),
            _part("F3", "cifar100, Dir(0.1)", "FedTSP-MiniLM - FedTGP", "FedTGP"),
        ),
        {},
    )  # fmt: skip
    found = [(f.claim, f.scope, f.verdict, f.reason, f.effect.n) for f in semantics(sem, plan=plan)]
    assert found[0][:2] == ("F1", "cifar10") and found[0][4] == 3
    assert found[1:] == [  # F3 is not a claim semantics judges, so it stays out
        ("F1", "cifar100", NOT_TESTABLE, "not testable at this budget: needs 51 seeds", 0),
        ("F2", "cifar100", NOT_TESTABLE, "planned, but no runs of it here", 0),
    ]
    # With no runs at all (a notebook whose every group the plan leaves out) the parts remain.
    empty = sem.iloc[:0]
    assert [f.scope for f in semantics(empty, plan=plan)] == ["cifar10", "cifar100", "cifar100"]
    table3 = AnalysisPlan(
        (_part("F15", "GFL, cifar100", "FedTSP-GFL - FedETF", "FedETF", seeds=23,
               status="not testable at this budget"),),
        {},
    )  # fmt: skip
    assert [
        (f.claim, f.reason) for f in homogeneous(pd.DataFrame(), {"cifar100": 1.0}, table3)
    ] == [("F15", "not testable at this budget: needs 23 seeds")]


def test_check_reports_unplanned_and_unjudged_parts_and_records_older_than_the_plan(tmp_path):
    commit = plan_commit()
    assert commit is not None
    plan = AnalysisPlan((_part("F3", "cifar10, Dir(0.1)", "A - B", "B"),), {})
    pd.DataFrame([{"claim": "F4", "scope": "cifar10, Dir(0.1)", "comparison": "A - C"}]).to_csv(
        tmp_path / "claims.csv", index=False
    )
    runs = tmp_path / "runs"
    runs.mkdir()
    first = subprocess.run(
        ["git", "rev-list", "--max-parents=0", "HEAD"], cwd=REPO_ROOT, capture_output=True,
        text=True, check=True,
    ).stdout.split()[0]  # fmt: skip
    head = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True, check=True
    ).stdout.strip()
    for key, code in (("old", first), ("new", head)):
        (runs / f"{key}.json").write_text(
            json.dumps(
                {"record_version": 1, "key": key, "status": "complete", "git_commit": code}
            )  # fmt: skip
        )
    problems = check(tmp_path, plan, commit)
    assert problems == [
        "claims.csv judges an unplanned part: F4 cifar10, Dir(0.1): A - C",
        "planned part not judged: F3 cifar10, Dir(0.1): A - B",
        f"run old comes from code {first}, not after the plan's commit {commit}",
    ]


def test_an_addendum_adds_parts_and_groups_and_holds_its_groups_to_its_own_commit(tmp_path):
    import dataclasses

    from fedtsp.core.config import RunConfig
    from fedtsp.core.results import RunStore

    record = next(RunStore(REPO_ROOT / "results" / "pilot" / "runs").records())
    group = seed_group(RunConfig.from_dict(record["config"]))
    main_group = PLAN["groups"][0]
    addendum = {
        "parts": [dataclasses.asdict(_part("M2", "overlapping-labels", "fmcl - cfl", "cfl"))],
        "groups": [{"id": "new", "seeds": 7}, main_group | {"seeds": main_group["seeds"] + 2}],
    }
    path = tmp_path / "addendum.json"
    path.write_text(json.dumps(addendum))
    profile = load_profile("evidence")
    profile = dataclasses.replace(
        profile, extra=profile.extra | {"analysis_plan": ["analysis_plan.json", str(path)]}
    )
    merged = analysis_plan_data(profile)
    assert len(merged["parts"]) == len(PLAN["parts"]) + 1
    seeds = group_seeds(merged)
    assert seeds["new"] == 7 and seeds[main_group["id"]] == main_group["seeds"] + 2
    assert len(seeds) == len(PLAN["groups"]) + 1  # a group both name is listed once
    # A record of an addendum's group must descend from the addendum's commit as well.
    runs = tmp_path / "results" / "runs"
    runs.mkdir(parents=True)
    (runs / f"{record['key']}.json").write_text(json.dumps(record))
    root = subprocess.run(
        ["git", "rev-list", "--max-parents=0", "HEAD"], cwd=REPO_ROOT, capture_output=True,
        text=True, check=True,
    ).stdout.split()[0]  # fmt: skip
    plan = AnalysisPlan((), {})
    seed = record["config"]["seed"]
    assert check(runs.parent, plan, root) == []
    assert check(runs.parent, plan, root, {group: (plan_commit(), frozenset({seed}))}) == [
        f"run {record['key']} comes from code {record['git_commit']}, not after the "
        f"addendum's commit {plan_commit()}"
    ]
    # A seed the plan already ran in a group the addendum extends keeps the plan's rule.
    assert check(runs.parent, plan, root, {group: (plan_commit(), frozenset({seed + 1}))}) == []
    assert check(runs.parent, plan, root, {"another group": (plan_commit(), frozenset())}) == []


@pytest.mark.parametrize(
    "name", [n for n in profile_names() if load_profile(n).extra.get("analysis_plan")]
)
def test_committed_outputs_of_a_planned_profile_keep_to_its_plan(name):
    """Every judged part planned and every record from the plan's commit on (nothing to
    check until the profile's runs are committed)."""
    results = REPO_ROOT / "results" / name
    assert check(results, load_plan(name), plan_commit(), addendum_commits(name)) == []


def test_the_budget_leaves_out_the_notebooks_own_work_and_a_last_run_alone():
    profile = load_profile("evidence")
    full = 12 * 3600 * profile.workers
    assert full - 3600 < budget_seconds(profile) < full
    assert budget_seconds(profile, longest=1000.0) == pytest.approx(
        budget_seconds(profile) - 1000.0 * (profile.workers - 1)
    )


def test_reproduce_plan_estimates_the_planned_profile_within_the_budget(tmp_path):
    """`fedtsp reproduce --profile evidence --plan` from an empty store: every run priced
    from measured twins, and the whole within 12 hours at the profile's workers. The twins
    are those the plan was priced from: the stores committed when its last file was, but the
    evidence profile's own. Records committed since (the batch's own, a store rerun on
    another machine) are timed under other conditions and do not reprice a plan written
    before them."""
    from fedtsp.paper.plan import make_plan, stores_at

    profile = load_profile("evidence")
    files = analysis_plan_files(profile)
    priced_at = plan_commit(*files)
    before = [s for s in stores_at(priced_at, tmp_path / "then") if s.parent.name != profile.name]
    assert before  # (a shallow clone has no history to read them from)
    empty = tmp_path / "results"
    runs, _ = make_plan(profile, find_notebooks(NOTEBOOKS_DIR), empty, profile.workers, before)
    assert {r.source for r in runs} == {"twin"} and not any(r.stored for r in runs)
    assert len(runs) == sum(group_seeds(analysis_plan_data(profile)).values())
    plans = [json.loads(p.read_text()) for p in files]
    hours = sum(r.seconds for r in runs) / profile.workers / 3600
    planned = sum(f["planned_run_seconds"] for f in plans) / profile.workers / 3600
    assert hours == pytest.approx(planned, rel=0.01)
    assert hours <= sum(f["budget_hours"] for f in plans)


def test_the_committed_plan_is_not_rebuilt_without_replace(capsys):
    from fedtsp.paper.claims.analysis_plan import main

    before = PLAN_FILE.read_bytes()
    assert main([]) == 2
    assert "pre-registered" in capsys.readouterr().err
    assert PLAN_FILE.read_bytes() == before


def test_a_notebook_under_the_plan_names_the_groups_it_does_not_run_and_its_tables_say_so(
    tmp_path,
):
    from fedtsp.paper.notebook import unplanned_groups
    from fedtsp.paper.outputs import ResultsWriter

    params = notebook_parameters("evidence", "03_main_table")
    left = unplanned_groups("03_main_table", params, DataSource(params["data"]))
    assert "cifar10, 0.1, FedGH, htfe-cpu" in left  # the plan gives FedGH no seeds
    assert not any("FedKD" in g and "cifar10, 0.1," in g for g in left)  # F4's comparator runs
    assert (
        unplanned_groups("03_main_table", notebook_parameters("cpu", "03_main_table"), None) == []
    )
    writer = ResultsWriter(tmp_path, "03_main_table", "evidence")
    writer.unplanned = left
    writer.table(pd.DataFrame({"a": [1]}), "t", target="T", caption="c")
    assert (
        f"Under the analysis plan {len(left)} groups" in (tmp_path / "tables" / "t.md").read_text()
    )

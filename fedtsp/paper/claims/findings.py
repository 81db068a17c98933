"""The findings of each notebook: which comparisons test its claims, on its own frames.

One function per notebook (`semantics` for 02, `main_table` for 03, ...) takes the frames
the notebook has built and returns one `Finding` per tested part of its claims, judged
together (`judge`: Holm within each claim). Frames from `runs_table` carry each run's label
prior and plateau, which set the parts' floors (`context`).

Without an analysis plan a part compares FedTSP with the strongest of its rivals on the
same seeds. Under a profile's plan (`plan`, `analysis_plan.AnalysisPlan`) each part
compares with the comparator the plan fixed in advance, and only the planned parts are
judged (Holm over them); a part the budget could not power says so.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import pandas as pd

from fedtsp.paper.claims.rule import (
    _EMPTY,
    NOT_TESTABLE,
    Finding,
    by_seed,
    compare,
    judge,
    strongest,
)
from fedtsp.paper.floors import CEILING

if TYPE_CHECKING:
    from fedtsp.paper.claims.analysis_plan import AnalysisPlan

PROTOTYPE_BASELINES = ("FedProto", "FedTGP", "AlignFed")
CLUSTERING_BASELINES = ("ifca", "cfl", "pacfl")
# F17's two sides: every choice of the authors' code at once, and the paper's reading.
AUTHORS_RUNS = ("FedTSP (authors' runs)", "FedTSP-MiniLM")


def fedtsp_labels(methods: Iterable[str]) -> list[str]:
    """The FedTSP variants among `methods` (one per text encoder)."""
    return [m for m in dict.fromkeys(methods) if str(m).startswith("FedTSP")]


# The floor of each accuracy column on the clients' own test splits (runs_table's columns).
_PRIORS = {"best_acc": "label_prior", "last5_acc": "label_prior", "best_top5": "label_prior_top5"}


def context(
    frame: pd.DataFrame, value: str, converged: str = "converged", **match: Any
) -> dict[str, Any]:
    """`compare`'s floor, ceiling and plateau arguments from the runs of `frame` matching
    every column = value of `match` (a column's value may be a list): the mean label prior
    of their partitions for a local-test accuracy, the ceiling for top-k, and whether all
    of them converged (and their rounds). Columns a frame lacks are left out."""
    rows = frame
    for column, wanted in match.items():
        wanted = wanted if isinstance(wanted, list | tuple | set) else [wanted]
        rows = rows[rows[column].isin(list(wanted))]
    out: dict[str, Any] = {}
    prior = _PRIORS.get(value)
    if prior in rows and rows[prior].notna().any():
        out["floor"] = float(rows[prior].mean())
    if value == "best_top5":
        out["ceiling"] = CEILING
    if converged in rows and len(rows):
        out["converged"] = bool(rows[converged].all())
        if "rounds" in rows:
            out["rounds"] = int(rows["rounds"].max())
    return out


def _versus_strongest(
    claim: str,
    scope: str,
    frame: pd.DataFrame,
    value: str,
    ours: str,
    rivals: Iterable[str],
    column: str = "method",
    plan: AnalysisPlan | None = None,
    **options: Any,
) -> list[Finding]:
    """`ours` minus the strongest of `rivals` on `frame`'s seeds, or, under `plan`, minus
    each comparator the plan fixed for this part (none if the plan has no such part)."""
    rivals = [r for r in rivals if r != ours]
    if plan is not None:
        chosen, fixed = plan.rivals(claim, scope), True
    else:
        best = strongest(frame, value, column, rivals, options.get("lower_is_better", False))
        chosen, fixed = ([best] if best is not None else []), False
    if not chosen and not fixed:
        return [Finding(claim, scope, f"{ours} vs -", _EMPTY, NOT_TESTABLE, "no compared runs")]
    out = []
    for rival in chosen:
        found = options
        if "chance" not in options:  # a balanced test set's floor is chance, given by the caller
            found = context(frame, value, **{column: [ours, rival]}) | options
        name = (
            f"{ours} - {rival} (strongest of {len(rivals)})"
            if len(rivals) > 1 and not fixed
            else f"{ours} - {rival}"
        )
        out.append(
            compare(
                claim,
                scope,
                name,
                by_seed(frame, value, **{column: ours}),
                by_seed(frame, value, **{column: rival}),
                **found,
            )
        )
    return out


def _judged(
    findings: Sequence[Finding], plan: AnalysisPlan | None, claims: Sequence[str]
) -> list[Finding]:
    """`judge`, over the planned parts only where there is a plan, which also names each
    part of `claims` (the claims the caller judges) that has no runs here."""
    return judge(findings if plan is None else plan.restrict(findings, claims))


def semantics(
    sem: pd.DataFrame,
    untrained: Mapping[tuple[str, str], Mapping[str, float]] | None = None,
    plan: AnalysisPlan | None = None,
) -> list[Finding]:
    """Fig. 1 (e, f): rho and gap per method, dataset and seed.

    `untrained` ((dataset, FedTSP label) -> {"rho": ..., "gap": ...}): that FedTSP's text
    encoder's own prototypes of its prompts before any training; each FedTSP is also compared
    with its own (does federated training add semantic structure, or keep the encoder's?).
    """
    out = []
    for claim, metric in (("F1", "rho"), ("F2", "gap")):
        for ds, part in sem.groupby("dataset", sort=False):
            for ours in fedtsp_labels(part["method"]):
                others = [m for m in part["method"].unique() if not m.startswith("FedTSP")]
                out += _versus_strongest(
                    claim, str(ds), part, metric, ours, others, plan=plan, unit=""
                )
                if untrained and (ds, ours) in untrained:
                    mine = by_seed(part, metric, method=ours)
                    before = {s: float(untrained[(ds, ours)][metric]) for s in mine}
                    out.append(
                        compare(
                            claim,
                            str(ds),
                            f"{ours} - its untrained text prototypes",
                            mine,
                            before,
                            unit="",
                        )
                    )
    return _judged(out, plan, ("F1", "F2"))


def main_table(
    main: pd.DataFrame,
    hetero: pd.DataFrame,
    curves: pd.DataFrame,
    chance: Mapping[str, float],
    plan: AnalysisPlan | None = None,
) -> list[Finding]:
    """Table 1 (F3-F5), Appendix D (F6), Fig. 3 (F7), Fig. 4 (F8) and Fig. 6 (F9).

    `chance`: accuracy (%) of a random guess per dataset; `curves`: per-round accuracy
    (method, dataset, alpha, seed, round, acc) of Table 1's runs.
    """
    out = []
    methods = list(main["method"].unique())
    ours_all = fedtsp_labels(methods)
    others = [m for m in methods if m not in ours_all]
    columns = list(main.groupby(["dataset", "alpha"], sort=False).groups)
    for ds, alpha in columns:
        part = main[(main["dataset"] == ds) & (main["alpha"] == alpha)]
        scope = f"{ds}, Dir({alpha:g})"
        for ours in ours_all:
            for claim, rivals in (("F3", PROTOTYPE_BASELINES), ("F4", others)):
                out += _versus_strongest(claim, scope, part, "best_acc", ours, rivals, plan=plan)
            out += _versus_strongest(
                "F7",
                scope,
                part,
                "global_acc",
                ours,
                PROTOTYPE_BASELINES,
                plan=plan,
                chance=chance[ds],
                **_plateau(part, [ours, *PROTOTYPE_BASELINES]),
            )
            out += _versus_strongest("F8", scope, part, "best_top5", ours, others, plan=plan)
            out += _convergence(scope, curves, ds, alpha, ours, part, plan)
    for ds in dict.fromkeys(ds for ds, _ in columns):
        alphas = sorted(a for d, a in columns if d == ds)
        for ours in ours_all:
            out.append(
                _heterogeneity_gain(main[main["dataset"] == ds], str(ds), alphas, ours, plan)
            )
    for family, part in hetero.groupby("family", sort=False):
        rivals = [m for m in part["method"].unique() if not m.startswith("FedTSP")]
        ds = str(part["dataset"].iloc[0])
        for ours in fedtsp_labels(part["method"]):
            out += _versus_strongest(
                "F6", f"{family}, {ds}", part, "best_acc", ours, rivals, plan=plan
            )
    return _judged(out, plan, ("F3", "F4", "F5", "F6", "F7", "F8", "F9"))


def _plateau(
    frame: pd.DataFrame, methods: list[str], converged: str = "converged"
) -> dict[str, Any]:
    """Only the plateau part of `context` (a balanced test set has no label prior)."""
    found = context(frame, "", converged=converged, method=methods)
    return {k: found[k] for k in ("converged", "rounds") if k in found}


def heterogeneity_comparison(ours: str, low: float, high: float) -> str:
    """F5's comparison at the smallest and the largest alpha."""
    return f"gain of {ours} over the prototype baseline, Dir({low:g}) minus Dir({high:g})"


def _heterogeneity_gain(
    frame: pd.DataFrame, ds: str, alphas: list[float], ours: str, plan: AnalysisPlan | None
) -> Finding:
    if len(alphas) < 2:
        return Finding(
            "F5",
            ds,
            f"gain of {ours} at the smallest minus the largest alpha",
            _EMPTY,
            NOT_TESTABLE,
            f"the profile runs one alpha ({', '.join(f'{a:g}' for a in alphas)})",
        )

    def gain(alpha: float) -> dict[int, float]:
        part = frame[frame["alpha"] == alpha]
        if plan is None:
            rival = strongest(part, "best_acc", "method", PROTOTYPE_BASELINES)
        else:  # F3's comparator in that column
            rival = next(iter(plan.rivals("F3", f"{ds}, Dir({alpha:g})")), None)
        mine = by_seed(part, "best_acc", method=ours)
        theirs = by_seed(part, "best_acc", method=rival)
        return {s: mine[s] - theirs[s] for s in mine.keys() & theirs.keys()}

    low, high = alphas[0], alphas[-1]
    return compare(
        "F5",
        ds,
        heterogeneity_comparison(ours, low, high),
        gain(low),
        gain(high),
    )


def convergence_comparison(rival: str, ours: str) -> str:
    """F9's comparison (the target accuracy is data, so it stays out of the name)."""
    return f"rounds to 95 % of {rival}'s best: {rival} minus {ours}"


def _convergence(
    scope: str,
    curves: pd.DataFrame,
    ds: str,
    alpha: float,
    ours: str,
    main: pd.DataFrame,
    plan: AnalysisPlan | None = None,
) -> list[Finding]:
    part = curves[(curves["dataset"] == ds) & (curves["alpha"] == alpha)]
    best = part.groupby(["method", "seed"])["acc"].max().reset_index()
    if plan is not None:
        fixed = plan.rivals("F9", scope)
        if not fixed:
            return []
        rival: str | None = fixed[0]
    else:
        rival = strongest(best, "acc", "method", PROTOTYPE_BASELINES)
    if rival is None or rival not in set(best["method"]):
        return [Finding("F9", scope, f"{ours} vs -", _EMPTY, NOT_TESTABLE, "no compared runs")]
    target = 0.95 * best[best["method"] == rival]["acc"].mean()
    runs = main[(main["dataset"] == ds) & (main["alpha"] == alpha)]
    plateau = _plateau(runs, [ours, rival])
    last = int(part["round"].max())

    def rounds(method: str) -> dict[int, float]:
        out = {}
        for seed, run in part[part["method"] == method].groupby("seed"):
            reached = run.loc[run["acc"] >= target, "round"]
            out[int(seed)] = float(reached.min()) if len(reached) else float(last + 1)
        return out

    return [
        compare(
            "F9",
            scope,
            convergence_comparison(rival, ours),
            rounds(ours),
            rounds(rival),
            lower_is_better=True,
            unit="rounds",
            **plateau,
        )
    ]


def control_part(encoder: str, dataset: str, control: str) -> tuple[str, str]:
    """The (scope, comparison) naming one semantic-control part of F11."""
    return f"{encoder}, {dataset}", f"(2) text - {control} targets"


def ablations(
    table2: pd.DataFrame,
    controls: pd.DataFrame,
    richness: pd.DataFrame,
    rows: Sequence[str],
    plan: AnalysisPlan | None = None,
) -> list[Finding]:
    """Table 2 (F10), the semantic controls (F11) and Fig. 5 left (F12).

    `rows`: Table 2's row labels (1) to (5) in order.
    """
    out = []
    r1, r2, r3, r4, r5 = rows
    steps = ((r2, r1), (r3, r2), (r4, r2), (r5, r3), (r5, r4))
    for encoder, part in table2.groupby("text_encoder", sort=False):
        ds = str(part["dataset"].iloc[0])
        for upper, lower in steps:
            out.append(
                compare(
                    "F10",
                    f"{encoder}, {ds}",
                    f"{upper[:3]} - {lower[:3]}",
                    by_seed(part, "best_acc", row=upper),
                    by_seed(part, "best_acc", row=lower),
                    **context(part, "best_acc", row=[upper, lower]),
                )
            )
        text = by_seed(part, "best_acc", row=r2)
        mine = controls[controls["text_encoder"] == encoder]
        for control, targets in mine.groupby("control", sort=False):
            both = pd.concat([part[part["row"] == r2], targets])
            out.append(
                compare(
                    "F11",
                    *control_part(str(encoder), ds, str(control)),
                    text,
                    by_seed(targets, "best_acc"),
                    **context(both, "best_acc"),
                )
            )
    for ds, part in richness.groupby("dataset", sort=False):
        for upper, lower in (("long", "short"), ("short", "manual")):
            out.append(
                compare(
                    "F12",
                    str(ds),
                    f"{upper} - {lower}",
                    by_seed(part, "best_acc", prompts=upper),
                    by_seed(part, "best_acc", prompts=lower),
                    **context(part, "best_acc", prompts=[upper, lower]),
                )
            )
    return _judged(out, plan, ("F10", "F11", "F12"))


def authors_runs(runs: pd.DataFrame, plan: AnalysisPlan | None = None) -> list[Finding]:
    """F17: FedTSP (authors' runs) minus the paper's reading, per dataset; `runs` with
    columns dataset, method, seed, best_acc."""
    authors, paper = AUTHORS_RUNS
    out = [
        compare(
            "F17",
            str(ds),
            f"authors' runs - {paper}",
            by_seed(part, "best_acc", method=authors),
            by_seed(part, "best_acc", method=paper),
            kind="within",
            **context(part, "best_acc"),
        )
        for ds, part in runs.groupby("dataset", sort=False)
    ]
    return _judged(out, plan, ("F17",))


def writers(runs: pd.DataFrame, plan: AnalysisPlan | None = None) -> list[Finding]:
    """Fig. 5 right (F13): `runs` with columns description_set, writer, dataset, seed, best_acc.

    The reference is the long set; a part is every set by another writer (the template,
    which no one wrote, and sets by the reference's own writer are left out).
    """
    out = []
    for ds, part in runs.groupby("dataset", sort=False):
        ref = part[part["description_set"] == "long"]
        if ref.empty:
            continue
        ref_writer = ref["writer"].iloc[0]
        others = part[(part["writer"] != ref_writer) & (part["description_set"] != "manual")]
        if others.empty:
            out.append(
                Finding(
                    "F13",
                    str(ds),
                    "another writer's set - long",
                    _EMPTY,
                    NOT_TESTABLE,
                    f"every description set here was written by {ref_writer}",
                )
            )
        for desc, other in others.groupby("description_set", sort=False):
            out.append(
                compare(
                    "F13",
                    str(ds),
                    f"{desc} ({other['writer'].iloc[0]}) - long ({ref_writer})",
                    by_seed(other, "best_acc"),
                    by_seed(ref, "best_acc"),
                    kind="within",
                    **context(pd.concat([other, ref]), "best_acc"),
                )
            )
    return _judged(out, plan, ("F13",))


def privacy(runs: pd.DataFrame, plan: AnalysisPlan | None = None) -> list[Finding]:
    """Table 4 (F14): `runs` with columns epsilon ("no DP" or the value), dataset, seed."""
    out = []
    for ds, part in runs.groupby("dataset", sort=False):
        clean = by_seed(part, "best_acc", epsilon="no DP")
        for eps in [e for e in part["epsilon"].unique() if e != "no DP"]:
            out.append(
                compare(
                    "F14",
                    f"{ds}, epsilon {eps}",
                    f"epsilon {eps} - no DP",
                    by_seed(part, "best_acc", epsilon=eps),
                    clean,
                    kind="no_worse",
                    **context(part, "best_acc", epsilon=[eps, "no DP"]),
                )
            )
    return _judged(out, plan, ("F14",))


def homogeneous(
    runs: pd.DataFrame, chance: Mapping[str, float], plan: AnalysisPlan | None = None
) -> list[Finding]:
    """Table 3 (F15 GFL, F16 PFL): `runs` with columns block, method, dataset, seed,
    setting_acc."""
    out = []
    blocks = runs.groupby(["block", "dataset"], sort=False) if len(runs) else []  # none run
    for (block, ds), part in blocks:
        claim = "F15" if block == "GFL" else "F16"
        rivals = [m for m in part["method"].unique() if not m.startswith("FedTSP")]
        for ours in fedtsp_labels(part["method"]):
            if block == "GFL":  # the global model on the balanced test set: chance, plateau
                plateau = _plateau(part, [ours, *rivals], "setting_converged")
                floors = {"chance": chance[ds], **plateau}
            else:  # personalised models on their clients' splits: the label prior
                floors = context(part, "best_acc", method=ours)
            out += _versus_strongest(
                claim, f"{block}, {ds}", part, "setting_acc", ours, rivals, plan=plan, **floors
            )
    return _judged(out, plan, ("F15", "F16"))


def fmcl(bench: pd.DataFrame, plan: AnalysisPlan | None = None) -> list[Finding]:
    """The FMCL benchmark (M1-M3): `bench` rows of `fmcl.benchmark_row` (accuracy in [0, 1]).

    Each finding names the baselines that found FMCL's very clusters on every seed, where
    a difference of 0 is then no evidence either way.
    """
    out = []
    frame = bench.assign(accuracy=100 * bench["best_acc"])
    for population, part in frame.groupby("population", sort=False):
        same = _same_clusters(part, "fmcl", CLUSTERING_BASELINES)
        note = f"same clusters as FMCL on every seed: {', '.join(same)}" if same else ""
        for claim, value, unit in (("M1", "accuracy", "points"), ("M2", "ari", "")):
            # The plateau caveat is the accuracy's: ARI judges the clusters themselves.
            runs = part if value == "accuracy" else part.drop(columns="converged", errors="ignore")
            found = _versus_strongest(
                claim, str(population), runs, value, "fmcl", CLUSTERING_BASELINES,
                plan=plan, unit=unit,
            )  # fmt: skip
            out += [_with_note(f, note) for f in found]
        out += _versus_strongest(
            "M3", str(population), part, "accuracy", "fmcl", ["fedavg"], plan=plan
        )
    return _judged(out, plan, ("M1", "M2", "M3"))


def _same_clusters(part: pd.DataFrame, ours: str, others: Iterable[str]) -> list[str]:
    mine = {
        int(r.seed): _canonical(r.assignment) for r in part[part["method"] == ours].itertuples()
    }
    same = []
    for other in others:
        theirs = {
            int(r.seed): _canonical(r.assignment)
            for r in part[part["method"] == other].itertuples()
        }
        if theirs and mine and all(theirs.get(s) == a for s, a in mine.items()):
            same.append(other)
    return same


def _canonical(assignment: Sequence[int]) -> tuple[int, ...]:
    """Cluster labels renamed in order of first appearance (the same partition, one name)."""
    names: dict[int, int] = {}
    return tuple(names.setdefault(int(a), len(names)) for a in assignment)


def _with_note(finding: Finding, note: str) -> Finding:
    if not note:
        return finding
    return replace(finding, reason=f"{finding.reason}; {note}" if finding.reason else note)

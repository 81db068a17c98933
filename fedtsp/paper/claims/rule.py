"""The verdict rule: one paired comparison by seed per part of a claim, and its verdict.

A `Finding` is one tested part of a claim (a dataset, an encoder, a baseline): the paired
effect in the direction the paper claims, its 95 % interval from `fedtsp.paper.statistics`,
its tests, and the verdict that `RULE` gives it: holds, equivalent, not separated,
contradicted, or not testable here (below the floor, at the ceiling, too few seeds).
`judge` corrects the parts of one claim together (Holm).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import pandas as pd

from fedtsp.core.results import PLATEAU_RULE
from fedtsp.paper.floors import CEILING, FLOOR_MARGIN
from fedtsp.paper.statistics import Summary, paired_difference

HOLDS = "holds"
EQUIVALENT = "equivalent"
NOT_SEPARATED = "not separated"
CONTRADICTED = "contradicted"
NOT_TESTABLE = "not testable here"
VERDICTS = (HOLDS, EQUIVALENT, NOT_SEPARATED, CONTRADICTED, NOT_TESTABLE)

ALPHA = 0.05  # family-wise error rate within one claim (Holm)
TOLERANCE = 1.0  # accuracy points: what "barely changes" / "costs little" is allowed
# Equivalence margins by unit until the pre-registered plan fixes each part's own: one
# accuracy point, 0.05 of rho or gap (a correlation), two rounds.
MARGINS = {"points": TOLERANCE, "": 0.05, "rounds": 2.0}
LEARNS = 5.0  # a balanced test set separates methods once the better side reaches 5x chance
MIN_SEEDS = 2  # an interval needs two paired seeds

RULE = (
    f"Every part of a claim is one paired comparison: the per-seed difference in the "
    f"direction the paper claims (same seed, so same partition, on both sides), summarised "
    f"by its mean and the 95 % Student-t interval of the mean. Each part's decisions are "
    f"tests at level {ALPHA:g} whose p-values are Holm-corrected over the claim's testable "
    f"parts (for one part, the test reads the 95 % interval). A claim that one side is "
    f"above the other **holds** when the difference is significant and positive, is "
    f"**contradicted** when significant and negative, is **equivalent** (a well-measured "
    f"no difference) when the interval lies inside ± the part's margin (two one-sided "
    f"tests), and is **not separated** otherwise. A claim that accuracy barely changes "
    f"holds when the interval lies inside ± the margin and is contradicted when it lies "
    f"wholly outside; a claim that something costs little holds when the interval's low end "
    f"is above -margin and is contradicted when its high end is below it. Margins: "
    f"{TOLERANCE:g} accuracy point, 0.05 of rho or gap, 2 rounds, unless the analysis plan "
    f"fixes another. A part is **not testable here** without its runs, with fewer than "
    f"{MIN_SEEDS} paired seeds, when the better side stays within {FLOOR_MARGIN:g} points of "
    f"the floor (on the clients' own test splits the label prior, each client answering "
    f"its most frequent training class; on a balanced test set {LEARNS:g}x chance or halfway "
    f"from chance to 100 %, and the runs must have converged), or, for top-k accuracy, when "
    f"either side is at or above {CEILING:g} %. A part whose runs had not converged "
    f"(plateau rule: {PLATEAU_RULE}) keeps its verdict and says so. A claim is contradicted "
    f"if any part is, holds if every testable part holds, is equivalent if every testable "
    f"part is, is not testable if no part is, and is not separated otherwise."
)


@dataclass(frozen=True)
class Finding:
    """One tested part of a claim: the paired effect (claimed direction positive), the
    kind of claim, its margin, its raw p-values per test, the verdict and its Holm p."""

    claim: str
    scope: str
    comparison: str
    effect: Summary
    verdict: str
    reason: str = ""
    unit: str = "points"
    kind: str = "above"
    margin: float = math.nan
    tests: tuple[tuple[str, float], ...] = ()
    p_holm: float = math.nan

    def row(self) -> dict[str, Any]:
        return {
            "claim": self.claim,
            "scope": self.scope,
            "comparison": self.comparison,
            "unit": self.unit,
            **self.effect.as_dict(),
            "margin": self.margin,
            "p_holm": self.p_holm,
            "verdict": self.verdict,
            "reason": self.reason,
        }


def learning_threshold(chance: float) -> float:
    """Accuracy (%) the better side must reach on a balanced test set: `LEARNS` x chance,
    capped at halfway from chance to 100 % (top-5 of ten classes: chance 50 %, need 75 %)."""
    return min(LEARNS * chance, (100 + chance) / 2)


_EMPTY = Summary(math.nan, math.nan, 0, math.nan, math.nan)
_KINDS = ("above", "within", "no_worse")


def _p_above(effect: Summary, h: float) -> float:
    """One-sided p of "the mean difference is above h" (Student t, n - 1 df)."""
    if effect.std == 0:
        return 0.0 if effect.mean > h else 1.0
    from scipy.stats import t as student  # scipy.stats takes a second to import: on use

    t = (effect.mean - h) / (effect.std / math.sqrt(effect.n))
    return float(student.sf(t, effect.n - 1))


def _p_below(effect: Summary, h: float) -> float:
    if effect.std == 0:
        return 0.0 if effect.mean < h else 1.0
    from scipy.stats import t as student

    t = (effect.mean - h) / (effect.std / math.sqrt(effect.n))
    return float(student.cdf(t, effect.n - 1))


def tests(effect: Summary, kind: str, margin: float) -> dict[str, float]:
    """The raw p-values of a part's tests, each doubled so that p < 0.05 reads the 95 %
    interval: "differs" (excludes 0), "equivalent" (inside ± margin), "outside" (wholly
    outside ± margin), "no_worse" (low end above -margin), "worse" (high end below it)."""
    if kind not in _KINDS:
        raise ValueError(f"kind={kind!r} is invalid; must be above, within or no_worse")
    two = {
        "differs": min(_p_above(effect, 0.0), _p_below(effect, 0.0)),
        "equivalent": max(_p_above(effect, -margin), _p_below(effect, margin)),
        "outside": min(_p_above(effect, margin), _p_below(effect, -margin)),
        "no_worse": _p_above(effect, -margin),
        "worse": _p_below(effect, -margin),
    }
    used = {
        "above": ("differs", "equivalent"),
        "within": ("equivalent", "outside"),
        "no_worse": ("no_worse", "worse"),
    }[kind]
    return {name: min(1.0, 2 * two[name]) for name in used}


def decide(effect: Summary, kind: str, p: Mapping[str, float]) -> tuple[str, float]:
    """(verdict, p of the deciding test) from a part's (adjusted) p-values."""
    if kind == "above":
        if p["differs"] < ALPHA:
            return (HOLDS if effect.mean > 0 else CONTRADICTED), p["differs"]
        if p["equivalent"] < ALPHA:
            return EQUIVALENT, p["equivalent"]
        return NOT_SEPARATED, p["differs"]
    first, second = ("equivalent", "outside") if kind == "within" else ("no_worse", "worse")
    if p[first] < ALPHA:
        return HOLDS, p[first]
    if p[second] < ALPHA:
        return CONTRADICTED, p[second]
    return NOT_SEPARATED, p[first]


def verdict(effect: Summary, kind: str = "above", margin: float = TOLERANCE) -> str:
    """The verdict of one paired effect (claimed direction positive) on its own (no Holm).

    `kind`: "above" (A above B), "within" (|A - B| <= margin), "no_worse"
    (A - B >= -margin). Fewer than `MIN_SEEDS` seeds: not testable.
    """
    if kind not in _KINDS:
        raise ValueError(f"kind={kind!r} is invalid; must be above, within or no_worse")
    if effect.n < MIN_SEEDS or math.isnan(effect.ci_low):
        return NOT_TESTABLE
    return decide(effect, kind, tests(effect, kind, margin))[0]


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values, in the input order."""
    order = sorted(range(len(p_values)), key=lambda i: p_values[i])
    adjusted = [1.0] * len(p_values)
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(p_values) - rank) * p_values[i]))
        adjusted[i] = running
    return adjusted


def judge(findings: Sequence[Finding]) -> list[Finding]:
    """Every finding's verdict from its tests, Holm-corrected over its claim's testable parts
    (one family per test name); parts that are not testable stay as they are."""
    out = list(findings)
    claims = dict.fromkeys(f.claim for f in out)
    for claim in claims:
        parts = [i for i, f in enumerate(out) if f.claim == claim and f.tests]
        adjusted: dict[int, dict[str, float]] = {i: {} for i in parts}
        for name in dict.fromkeys(n for i in parts for n, _ in out[i].tests):
            members = [i for i in parts if name in dict(out[i].tests)]
            for i, p in zip(
                members, holm([dict(out[i].tests)[name] for i in members]), strict=True
            ):
                adjusted[i][name] = p
        for i in parts:
            result, p = decide(out[i].effect, out[i].kind, adjusted[i])
            out[i] = replace(out[i], verdict=result, p_holm=p)
    return out


def overall(verdicts: Iterable[str]) -> str:
    """A claim's verdict from its parts' (see `RULE`)."""
    testable = [v for v in verdicts if v != NOT_TESTABLE]
    if not testable:
        return NOT_TESTABLE
    if CONTRADICTED in testable:
        return CONTRADICTED
    for same in (HOLDS, EQUIVALENT):
        if all(v == same for v in testable):
            return same
    return NOT_SEPARATED


def compare(
    claim: str,
    scope: str,
    comparison: str,
    claimed: Mapping[Any, float],
    other: Mapping[Any, float],
    *,
    kind: str = "above",
    chance: float | None = None,
    floor: float | None = None,
    ceiling: float | None = None,
    converged: bool | None = None,
    rounds: int | None = None,
    margin: float | None = None,
    lower_is_better: bool = False,
    unit: str = "points",
) -> Finding:
    """`claimed` minus `other` paired by seed (reversed if lower is better), with its tests
    and its verdict on its own (`judge` corrects a claim's parts together).

    Floors (in the values' unit): `floor`, a local test split's label prior (the better side
    must clear it by `FLOOR_MARGIN`); `chance`, a balanced test set's (the better side must
    reach `learning_threshold(chance)` and the runs must have converged). `ceiling`: both
    sides must stay below it (top-k accuracy). `converged` (None: unknown) and `rounds` say
    whether the runs of both sides had reached a plateau by the end of their `rounds`.
    """
    margin = MARGINS.get(unit, TOLERANCE) if margin is None else margin
    if not claimed or not other:
        missing = "the claimed side" if not claimed else "the compared side"
        return Finding(claim, scope, comparison, _EMPTY, NOT_TESTABLE, f"no runs of {missing}",
                       unit=unit, kind=kind, margin=margin)  # fmt: skip
    effect, seeds = (
        paired_difference(claimed, other) if lower_is_better else paired_difference(other, claimed)
    )
    reasons = []
    testable = effect.n >= MIN_SEEDS
    if not testable:
        reasons.append(f"{effect.n} paired seed: no interval")
    best = max(_mean(claimed), _mean(other))
    if floor is not None and not math.isnan(floor) and best < floor + FLOOR_MARGIN:
        testable = False
        reasons.append(
            f"the better side reaches {best:.1f} %, within {FLOOR_MARGIN:g} points of the "
            f"label prior ({floor:.1f} %)"
        )
    if chance is not None:
        needed = learning_threshold(chance)
        if best < needed:
            testable = False
            reasons.append(
                f"the better side reaches {best:.1f} %, below the {needed:.0f} % a setting "
                f"must reach (chance {chance:.0f} %): the setting barely learns"
            )
    if ceiling is not None and best >= ceiling:
        testable = False
        reasons.append(f"a side reaches {best:.1f} %, at or above the {ceiling:g} % ceiling")
    if converged is False:
        at = f" at {rounds} rounds" if rounds else ""
        reasons.append(f"not converged{at}")
        if chance is not None:  # a balanced test set needs converged runs
            testable = False
            reasons[-1] += " (a balanced test set needs converged runs)"
    if not testable:
        why = "; ".join(reasons)
        return Finding(claim, scope, comparison, effect, NOT_TESTABLE, why, unit=unit, kind=kind,
                       margin=margin)  # fmt: skip
    found = tests(effect, kind, margin)
    result, p = decide(effect, kind, found)
    why = "; ".join(reasons)
    return Finding(claim, scope, comparison, effect, result, why, unit=unit, kind=kind,
                   margin=margin, tests=tuple(found.items()), p_holm=p)  # fmt: skip


def _mean(values: Mapping[Any, float]) -> float:
    return sum(values.values()) / len(values)


def by_seed(frame: pd.DataFrame, value: str, **match: Any) -> dict[int, float]:
    """seed -> `value` of the rows of `frame` matching every column = value of `match`."""
    part = frame
    for column, wanted in match.items():
        part = part[part[column] == wanted]
    return {int(s): float(v) for s, v in zip(part["seed"], part[value], strict=True)}


def strongest(
    frame: pd.DataFrame,
    value: str,
    column: str,
    candidates: Iterable[str],
    lower_is_better: bool = False,
) -> str | None:
    """The candidate (a value of `column` in `frame`) with the best mean `value`."""
    present = frame[frame[column].isin(list(candidates))]
    if present.empty:
        return None
    means = present.groupby(column)[value].mean()
    return str(means.idxmin() if lower_is_better else means.idxmax())

"""The verdict rule: one paired comparison by seed per part of a claim, and its verdict.

A `Finding` is one tested part of a claim (a dataset, an encoder, a baseline): the paired
effect in the direction the paper claims, its 95 % interval from `fedtsp.paper.statistics`,
and the verdict that `RULE` gives it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import pandas as pd

from fedtsp.paper.statistics import Summary, paired_difference

HOLDS = "holds"
NOT_SEPARATED = "not separated"
CONTRADICTED = "contradicted"
NOT_TESTABLE = "not testable here"
VERDICTS = (HOLDS, NOT_SEPARATED, CONTRADICTED, NOT_TESTABLE)

TOLERANCE = 1.0  # accuracy points: what "barely changes" / "costs little" is allowed
LEARNS = 5.0  # a setting separates methods once the better side reaches 5x chance accuracy
MIN_SEEDS = 2  # an interval needs two paired seeds

RULE = (
    f"Every part of a claim is one paired comparison: the per-seed difference in the "
    f"direction the paper claims (same seed on both sides), summarised by its mean and the "
    f"95 % Student-t interval of the mean. A claim that one side is above the other "
    f"**holds** when the interval lies above 0, is **contradicted** when it lies below 0 and "
    f"is **not separated** otherwise. A claim that accuracy barely changes (within "
    f"±{TOLERANCE:g} point) holds when the interval lies inside ±{TOLERANCE:g}, is "
    f"contradicted when it lies wholly outside, and is not separated otherwise; a claim "
    f"that something costs little (at most {TOLERANCE:g} point) holds when the interval's "
    f"low end is above -{TOLERANCE:g} and is contradicted when its high end is below "
    f"-{TOLERANCE:g}. A part is **not testable here** without its runs, with fewer than "
    f"{MIN_SEEDS} paired seeds (no interval), or when the better of its two sides stays "
    f"below {LEARNS:g}x chance accuracy, or below halfway from chance to 100 % where that "
    f"is lower (a setting that barely learns cannot separate methods). A claim is contradicted if any part is, holds if every testable part "
    f"holds, is not testable if no part is, and is not separated otherwise."
)


@dataclass(frozen=True)
class Finding:
    """One tested part of a claim: the paired effect (claimed direction positive)."""

    claim: str
    scope: str
    comparison: str
    effect: Summary
    verdict: str
    reason: str = ""
    unit: str = "points"

    def row(self) -> dict[str, Any]:
        return {
            "claim": self.claim,
            "scope": self.scope,
            "comparison": self.comparison,
            "unit": self.unit,
            **self.effect.as_dict(),
            "verdict": self.verdict,
            "reason": self.reason,
        }


def learning_threshold(chance: float) -> float:
    """Accuracy (%) the better side must reach for a part to be testable: `LEARNS` x chance,
    capped at halfway from chance to 100 % (top-5 of ten classes: chance 50 %, need 75 %)."""
    return min(LEARNS * chance, (100 + chance) / 2)


_EMPTY = Summary(math.nan, math.nan, 0, math.nan, math.nan)


def verdict(effect: Summary, kind: str = "above") -> str:
    """The verdict of one paired effect (claimed direction positive) under `RULE`.

    `kind`: "above" (A above B), "within" (|A - B| <= TOLERANCE), "no_worse"
    (A - B >= -TOLERANCE). Fewer than `MIN_SEEDS` seeds: not testable.
    """
    if effect.n < MIN_SEEDS or math.isnan(effect.ci_low):
        return NOT_TESTABLE
    low, high = effect.ci_low, effect.ci_high
    if kind == "above":
        return HOLDS if low > 0 else CONTRADICTED if high < 0 else NOT_SEPARATED
    if kind == "within":
        if low >= -TOLERANCE and high <= TOLERANCE:
            return HOLDS
        return CONTRADICTED if low > TOLERANCE or high < -TOLERANCE else NOT_SEPARATED
    if kind == "no_worse":
        return HOLDS if low > -TOLERANCE else CONTRADICTED if high < -TOLERANCE else NOT_SEPARATED
    raise ValueError(f"kind={kind!r} is invalid; must be above, within or no_worse")


def overall(verdicts: Iterable[str]) -> str:
    """A claim's verdict from its parts' (see `RULE`)."""
    testable = [v for v in verdicts if v != NOT_TESTABLE]
    if not testable:
        return NOT_TESTABLE
    if CONTRADICTED in testable:
        return CONTRADICTED
    return HOLDS if all(v == HOLDS for v in testable) else NOT_SEPARATED


def compare(
    claim: str,
    scope: str,
    comparison: str,
    claimed: Mapping[Any, float],
    other: Mapping[Any, float],
    *,
    kind: str = "above",
    chance: float | None = None,
    lower_is_better: bool = False,
    unit: str = "points",
) -> Finding:
    """`claimed` minus `other` paired by seed (reversed if lower is better), with its verdict.

    `chance` (in the values' unit): the part is not testable when neither side's mean
    reaches `learning_threshold(chance)`.
    """
    if not claimed or not other:
        missing = "the claimed side" if not claimed else "the compared side"
        return Finding(
            claim, scope, comparison, _EMPTY, NOT_TESTABLE, f"no runs of {missing}", unit
        )
    effect, seeds = (
        paired_difference(claimed, other) if lower_is_better else paired_difference(other, claimed)
    )
    result = verdict(effect, kind)
    reason = ""
    if effect.n < MIN_SEEDS:
        reason = f"{effect.n} paired seed: no interval"
    elif chance is not None:
        best, needed = max(_mean(claimed), _mean(other)), learning_threshold(chance)
        if best < needed:
            result = NOT_TESTABLE
            reason = (
                f"the better side reaches {best:.1f} %, below the {needed:.0f} % a setting "
                f"must reach (chance {chance:.0f} %): the setting barely learns"
            )
    return Finding(claim, scope, comparison, effect, result, reason, unit)


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

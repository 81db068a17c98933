"""Seeds and budget for a pre-registered analysis plan.

Each planned part of a claim asks for the fewest seeds that give `POWER` to reach its
verdict when the effect of interest is true: a paired t-test finding the paper's effect
(kind "above"), or two one-sided tests calling a true difference of 0 equivalent within the
margin ("within"; "above" parts whose interest is a null result use it too), each at the
level Holm gives the claim's smallest p-value in the worst case (`ALPHA` / number of parts).
`allocate` then spends a budget of run-seconds on the parts in priority order: a part whose
seeds do not fit is "not testable at this budget", with the seeds it would need.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from fedtsp.paper.claims.rule import ALPHA
from fedtsp.paper.statistics import equivalence_power, paired_power, seeds_for_power

POWER = 0.8
PLANNED = "planned"
OVER_BUDGET = "not testable at this budget"
MOST_SEEDS = 100


def seeds_needed(kind: str, sd: float, effect: float, margin: float, parts: int = 1) -> int | None:
    """Seeds for `POWER` at level ALPHA / `parts`; None beyond `MOST_SEEDS`.

    `kind`: "above" (find `effect`), "equivalent" (call 0 equivalent within `margin`).
    """
    level = ALPHA / max(parts, 1)
    if kind == "above":
        return seeds_for_power(lambda n: paired_power(effect, sd, n, level), POWER, MOST_SEEDS)
    if kind == "equivalent":
        return seeds_for_power(lambda n: equivalence_power(margin, sd, n, level), POWER, MOST_SEEDS)
    raise ValueError(f"kind={kind!r} is invalid; must be above or equivalent")


@dataclass(frozen=True)
class PlannedPart:
    """One part of a claim as planned: what is compared, why, and which runs it needs.

    `groups` names the run groups the part compares (e.g. "cifar10/FedTSP-MiniLM"): every
    group is one config run once per seed, shared by every part that compares it.
    """

    claim: str
    scope: str
    comparison: str
    kind: str  # what the seeds are powered for: "above" or "equivalent"
    effect: float  # the effect of interest (points), for "above"
    margin: float  # the equivalence margin (points)
    sd: float  # the paired differences' sd the power is computed from
    seeds: int | None  # seeds for POWER (None: more than MOST_SEEDS)
    groups: tuple[str, ...]
    priority: int  # lower first
    status: str = ""  # "planned", "not testable at this budget", or why not testable here
    comparator: str = ""  # the other side, fixed in advance ("" where it is not a method)
    unit: str = "points"
    note: str = ""  # where the comparator and the sd come from


def allocate(
    parts: Sequence[PlannedPart],
    seconds: Mapping[str, float],
    budget_seconds: float,
    start: Mapping[str, int] | None = None,
    paid: Mapping[str, int] | None = None,
) -> tuple[list[PlannedPart], dict[str, int]]:
    """Spend `budget_seconds` of run time (all workers' seconds together) on the parts in
    priority order (ties: as given). A part raises each of its groups to its seeds; its
    cost is the runs that adds (a group already at that many seeds costs nothing more),
    at `seconds[group]` a run. A part that needs more than `MOST_SEEDS` seeds, or more than
    is left, is not testable at this budget. `start`: seeds every group gets in any case
    (their cost is spent first). `paid`: seeds groups already have from an earlier plan
    (they cost nothing here). Returns the parts with their status and the seeds per
    group."""
    have = dict(start or {})
    left = budget_seconds - sum(n * seconds[g] for g, n in have.items())
    for g, n in (paid or {}).items():
        have[g] = max(have.get(g, 0), n)
    out = []
    for part in sorted(parts, key=lambda p: p.priority):
        extra = (
            sum(max(0, part.seeds - have.get(g, 0)) * seconds[g] for g in part.groups)
            if part.seeds is not None
            else None
        )
        if extra is not None and extra <= left:
            left -= extra
            for g in part.groups:
                have[g] = max(have.get(g, 0), part.seeds)
            out.append(replace(part, status=PLANNED))
        else:
            out.append(replace(part, status=OVER_BUDGET))
    return out, have

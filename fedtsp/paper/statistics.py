"""Statistics over seeds, the one source for every table, figure and verdict.

A set of per-seed values is summarised by its mean, its sample standard deviation
(ddof = 1) and a 95 % confidence interval for the mean from Student's t with n - 1 degrees
of freedom. Two methods are compared by pairing their values seed by seed (same seed,
same partition and initialisation where the protocol shares them) and summarising the
differences the same way. One value has no spread: its std and interval are NaN and its
cell says "n = 1", never "± 0.00".
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import pandas as pd

CONFIDENCE = 0.95
COLUMNS = ("mean", "std", "n", "ci_low", "ci_high")


@dataclass(frozen=True)
class Summary:
    """Mean, sample std (ddof = 1), count and the 95 % t-interval of the mean."""

    mean: float
    std: float
    n: int
    ci_low: float
    ci_high: float

    def cell(self, decimals: int = 2) -> str:
        """The table cell, "mean ± std" (see `cell`)."""
        return cell(self.mean, self.std, self.n, decimals)

    def interval(self, decimals: int = 2) -> str:
        """ "[low, high]" of the 95 % interval, signed (for differences); "-" without one."""
        if math.isnan(self.ci_low):
            return "-"
        return f"[{self.ci_low:+.{decimals}f}, {self.ci_high:+.{decimals}f}]"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def cell(mean: float, std: float, n: int, decimals: int = 2) -> str:
    """ "mean ± std" over n seeds, never a bare "± 0.00": one value has no spread to show
    ("mean (n = 1)"), identical values say so ("mean (n = 3, all equal)"), and a spread too
    small for the decimals reads "± <0.01" (at 2 decimals); "-" where there is no value."""
    if n == 0 or pd.isna(mean):
        return "-"
    if n == 1:
        return f"{mean:.{decimals}f} (n = 1)"
    if std == 0:
        return f"{mean:.{decimals}f} (n = {n}, all equal)"
    if round(std, decimals) == 0:
        return f"{mean:.{decimals}f} ± <{10**-decimals:.{decimals}f}"
    return f"{mean:.{decimals}f} ± {std:.{decimals}f}"


def summarize(values: Iterable[float]) -> Summary:
    """Summary of finite values (NaNs dropped)."""
    x = np.asarray([v for v in values if v is not None], dtype=float)
    x = x[~np.isnan(x)]
    n = int(x.size)
    if n == 0:
        return Summary(math.nan, math.nan, 0, math.nan, math.nan)
    mean = float(x.mean())
    if n == 1:
        return Summary(mean, math.nan, 1, math.nan, math.nan)
    # Identical values have exactly no spread (np.std would leave float dust from the mean).
    std = 0.0 if np.ptp(x) == 0 else float(x.std(ddof=1))
    from scipy import stats as _scipy_stats  # a second to import: on use, not with the module

    half = float(_scipy_stats.t.ppf(0.5 + CONFIDENCE / 2, n - 1)) * std / math.sqrt(n)
    return Summary(mean, std, n, mean - half, mean + half)


def paired_difference(
    baseline: Mapping[Any, float], other: Mapping[Any, float]
) -> tuple[Summary, list[Any]]:
    """Summary of ``other - baseline`` over the seeds both have, and those seeds (sorted).

    Seeds present in only one of the two are left out: an unpaired value says nothing about
    the difference the pairing controls for.
    """
    seeds = sorted(set(baseline) & set(other))
    return summarize(other[s] - baseline[s] for s in seeds), seeds


def summary_frame(frame: pd.DataFrame, by: Sequence[str], value: str) -> pd.DataFrame:
    """One row per group of ``by`` (first-appearance order) with the ``COLUMNS`` of
    ``summarize(frame[value])``: the numeric form of a table, for CSV files."""
    rows = [
        {**dict(zip(by, key if isinstance(key, tuple) else (key,), strict=True)), **s.as_dict()}
        for key, part in frame.groupby(list(by), sort=False)
        for s in [summarize(part[value])]
    ]
    return pd.DataFrame(rows, columns=[*by, *COLUMNS])


def std_interval(values: Sequence[float]) -> tuple[float, float]:
    """(mean - std, mean + std) with the sample std: seaborn's ``errorbar`` callable, so a
    figure draws exactly the spread its table prints (no bar for one value)."""
    s = summarize(values)
    return (s.mean - s.std, s.mean + s.std)


def paired_power(effect: float, sd: float, n: int, alpha: float = 0.05) -> float:
    """Power of the two-sided paired t-test at level `alpha` to find a true mean difference
    `effect` whose per-seed differences have standard deviation `sd`, with `n` seeds
    (noncentral t; both tails counted)."""
    if n < 2:
        return 0.0
    df, ncp = n - 1, effect / (sd / math.sqrt(n))
    from scipy import stats as _scipy_stats

    crit = float(_scipy_stats.t.ppf(1 - alpha / 2, df))
    nct = _scipy_stats.nct
    return float(nct.sf(crit, df, ncp) + nct.cdf(-crit, df, ncp))


def equivalence_power(margin: float, sd: float, n: int, alpha: float = 0.05) -> float:
    """A lower bound on the power of two one-sided tests (each at `alpha` / 2, i.e. the 95 %
    interval inside ± `margin`) to call a true difference of 0 equivalent: one minus the
    two tails' miss probabilities (noncentral t)."""
    if n < 2:
        return 0.0
    df, ncp = n - 1, margin / (sd / math.sqrt(n))
    from scipy import stats as _scipy_stats

    crit = float(_scipy_stats.t.ppf(1 - alpha / 2, df))
    return max(0.0, 1.0 - 2.0 * float(_scipy_stats.nct.cdf(crit, df, ncp)))


def seeds_for_power(
    power_at: Callable[[int], float], target: float = 0.8, most: int = 100
) -> int | None:
    """The fewest seeds n (2 to `most`) with `power_at(n)` >= `target`; None beyond `most`."""
    for n in range(2, most + 1):
        if power_at(n) >= target:
            return n
    return None

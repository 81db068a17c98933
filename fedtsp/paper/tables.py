"""Result tables: mean ± std over seeds, the best cell per column, Markdown and LaTeX text."""

from __future__ import annotations

from collections.abc import Callable

import pandas as pd

from fedtsp.core.results import PLATEAU_RULE
from fedtsp.paper.floors import LABEL_PRIOR
from fedtsp.paper.statistics import cell, summary_frame

UNCONVERGED = "†"  # marks a cell with a run that had not reached its plateau
UNCONVERGED_NOTE = (
    f"{UNCONVERGED}: at least one of the cell's runs had not converged by the plateau rule "
    f"({PLATEAU_RULE})."
)
UNCONVERGED_SHORT = (
    f"{UNCONVERGED}: a run of the cell had not converged (plateau rule under the first table)."
)


def mean_std(
    frame: pd.DataFrame,
    index: str | list[str],
    columns: str | list[str],
    value: str,
    decimals: int = 2,
    converged: str = "converged",
) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """Pivot `value` to (index x columns): the "mean ± std" cells, the numeric means, and the
    tidy numbers behind them (one row per cell: mean, std, n, 95 % interval; for the CSV).

    Every number comes from `fedtsp.paper.statistics` (sample std, ddof = 1). Row and
    column order follow their first appearance in `frame`. Where `frame` says whether each
    run converged (its `converged` column, as `runs_table` gives), a cell with an unconverged
    run ends with `UNCONVERGED` and `numbers` has a `converged` column.
    """
    rows, cols = _list(index), _list(columns)
    numbers = summary_frame(frame, [*rows, *cols], value)
    if converged in frame:
        settled = frame.groupby([*rows, *cols], sort=False)[converged].agg(
            lambda c: bool(c.fillna(True).all())
        )
        numbers["converged"] = [settled[tuple(k)] for k in numbers[[*rows, *cols]].values]
    indexed = numbers.set_index([*rows, *cols])
    means = indexed["mean"].unstack(cols, sort=False)
    marks = numbers["converged"] if "converged" in numbers else [True] * len(numbers)
    cells = pd.Series(
        [
            cell(r.mean, r.std, r.n, decimals) + ("" if ok else f" {UNCONVERGED}")
            for r, ok in zip(numbers.itertuples(), marks, strict=True)
        ],
        index=indexed.index,
    )
    text = cells.unstack(cols, sort=False).reindex_like(means).fillna("-")
    return text, means, numbers


def with_label_prior(
    frame: pd.DataFrame,
    index: str,
    columns: str | list[str],
    value: str = "best_acc",
    prior: str = "label_prior",
) -> pd.DataFrame:
    """`frame` plus a `LABEL_PRIOR` row per table column and seed, whose `value` is the
    label prior of that seed's partition (runs_table's `prior` column): a table made from
    it shows the floor under its methods."""
    keys = [*_list(columns), "seed"]
    floor = frame.drop_duplicates(keys)[[*keys, prior]].rename(columns={prior: value})
    return pd.concat([frame, floor.assign(**{index: LABEL_PRIOR})], ignore_index=True)


def above_label_prior(frame: pd.DataFrame, value: str = "best_acc") -> pd.DataFrame:
    """`frame` with `value` replaced by its points above the run's label prior."""
    prior = "label_prior_top5" if value == "best_top5" else "label_prior"
    return frame.assign(**{value: frame[value] - frame[prior]})


def reading(
    numbers: pd.DataFrame,
    row: str,
    by: str | list[str],
    decimals: int = 2,
    higher_is_better: bool = True,
    floor: Callable[[tuple], float | None] | None = None,
) -> str:
    """ "Reading: ..." — per column of a table (`by`), its leading row and the runner-up with
    the gap between their means, from the numeric frame of `mean_std` (a floor row is no
    contender).

    `floor(column) -> value or None`: the level a setting must reach before its numbers
    compare methods (`fedtsp.paper.claims.learning_threshold`); a column whose leader stays
    below it is read as such, not as a ranking.
    """
    cols = _list(by)
    parts = []
    for key, part in numbers[numbers[row] != LABEL_PRIOR].groupby(cols, sort=False):
        key = key if isinstance(key, tuple) else (key,)
        name = ", ".join(str(k) for k in key)
        ranked = part.dropna(subset=["mean"]).sort_values("mean", ascending=not higher_is_better)
        if ranked.empty:
            continue
        top = ranked.iloc[0]
        text = f"{name}: {top[row]} leads with {cell(top['mean'], top['std'], top['n'], decimals)}"
        if len(ranked) > 1:
            second = ranked.iloc[1]
            gap = round(abs(top["mean"] - second["mean"]), decimals)
            text += (
                f", {gap:.{decimals}f} ahead of {second[row]}"
                if gap
                else f", tied with {second[row]}"
            )
        level = floor(key) if floor is not None else None
        if level is not None and (top["mean"] < level) == higher_is_better:
            text += (
                f" (below the {level:.0f} % a setting must reach to compare methods: not a result)"
            )
        parts.append(text)
    head = "Reading: " if higher_is_better else "Reading (lower is better): "
    return head + "; ".join(parts) + "." if parts else "Reading: no numbers."


def best_mask(means: pd.DataFrame, higher_is_better: bool = True) -> pd.DataFrame:
    """True at the best mean of each column (all ties marked); a floor row is no method."""
    methods = means.drop(index=LABEL_PRIOR, errors="ignore")
    best = methods.max() if higher_is_better else methods.min()
    return means.eq(best, axis=1) & means.notna() & (means.index != LABEL_PRIOR)[:, None]


def flatten(table: pd.DataFrame, index_name: str | None = None) -> pd.DataFrame:
    """Index into a leading column and multi-level column labels joined with ' / '."""
    out = table.copy()
    out.columns = [
        " / ".join(str(x) for x in c) if isinstance(c, tuple) else str(c) for c in out.columns
    ]
    out.index.name = index_name or out.index.name or ""
    return out.reset_index()


def _list(x: str | list[str]) -> list[str]:
    return [x] if isinstance(x, str) else list(x)


def _cells(table: pd.DataFrame, bold: pd.DataFrame | None, fmt: str) -> list[list[str]]:
    rows = []
    for i in range(len(table)):
        row = []
        for j in range(table.shape[1]):
            cell = str(table.iat[i, j])
            if bold is not None and bool(bold.iat[i, j]):
                cell = fmt.format(cell)
            row.append(cell)
        rows.append(row)
    return rows


# Derived numbers go to CSV with 10 significant digits: more than any reading needs, and short
# of the last bits that float summation order (thread count, CPU) changes between machines,
# so regenerating the outputs elsewhere changes no committed byte.
CSV_FLOAT_FORMAT = "%.10g"


def to_csv(table: pd.DataFrame) -> str:
    """``table`` as CSV text, numbers at the package's stated precision."""
    return table.to_csv(index=False, float_format=CSV_FLOAT_FORMAT)


def to_markdown(table: pd.DataFrame, bold: pd.DataFrame | None = None) -> str:
    """A GitHub-flavoured Markdown table; cells marked in `bold` are **bold**."""
    cols = [str(c) for c in table.columns]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(row) + " |" for row in _cells(table, bold, "**{}**")]
    return "\n".join(lines)


def _tex_escape(text: str) -> str:
    for a, b in (
        ("\\", r"\textbackslash{}"),
        ("&", r"\&"),
        ("%", r"\%"),
        ("_", r"\_"),
        ("#", r"\#"),
    ):
        text = text.replace(a, b)
    return text.replace("±", r"$\pm$")


def to_latex(table: pd.DataFrame, bold: pd.DataFrame | None = None, caption: str = "") -> str:
    """A booktabs LaTeX table; cells marked in `bold` are \\textbf."""
    cols = [_tex_escape(str(c)) for c in table.columns]
    escaped = table.map(lambda value: _tex_escape(str(value)))
    body = [" & ".join(row) + r" \\" for row in _cells(escaped, bold, r"\textbf{{{}}}")]
    lines = [
        r"\begin{table}[t]",
        r"\centering",
        rf"\caption{{{_tex_escape(caption)}}}" if caption else "",
        r"\begin{tabular}{" + "l" * len(cols) + "}",
        r"\toprule",
        " & ".join(cols) + r" \\",
        r"\midrule",
        *body,
        r"\bottomrule",
        r"\end{tabular}",
        r"\end{table}",
    ]
    return "\n".join(line for line in lines if line) + "\n"

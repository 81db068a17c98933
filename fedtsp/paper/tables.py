"""Result tables: mean ± std over seeds, the best cell per column, Markdown and LaTeX text."""

from __future__ import annotations

import numpy as np
import pandas as pd


def mean_pm_std(mean: float, std: float, n: int, decimals: int = 2) -> str:
    """ "mean ± std" over n seeds, never a bare "± 0.00": one seed has no spread to show
    ("mean (n = 1)"), identical seeds say so ("mean (n = 3, all equal)"), and a spread
    too small for the decimals reads "± <0.01"."""
    if pd.isna(mean):
        return "-"
    if n == 1:
        return f"{mean:.{decimals}f} (n = 1)"
    if std == 0:
        return f"{mean:.{decimals}f} (n = {n}, all equal)"
    if round(std, decimals) == 0:
        return f"{mean:.{decimals}f} ± <{10**-decimals:.{decimals}f}"
    return f"{mean:.{decimals}f} ± {std:.{decimals}f}"


def mean_std(
    frame: pd.DataFrame,
    index: str | list[str],
    columns: str | list[str],
    value: str,
    decimals: int = 2,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Pivot `value` to (index x columns) as "mean ± std" strings, plus the numeric means.

    The std is the population std over seeds (ddof=0), as in the paper's tables. Row and
    column order follow their first appearance in `frame`.
    """
    grouped = frame.groupby([*_list(index), *_list(columns)], sort=False)[value]
    stats = grouped.agg(["mean", lambda v: float(np.std(v, ddof=0)), "count"])
    stats.columns = ["mean", "std", "n"]
    means = stats["mean"].unstack(_list(columns), sort=False)
    stds = stats["std"].unstack(_list(columns), sort=False)
    counts = stats["n"].unstack(_list(columns), sort=False)
    text = means.copy().astype(object)
    for r in means.index:
        for c in means.columns:
            n = counts.loc[r, c]
            text.loc[r, c] = mean_pm_std(
                means.loc[r, c], stds.loc[r, c], 0 if pd.isna(n) else n, decimals
            )
    return text, means


def best_mask(means: pd.DataFrame, higher_is_better: bool = True) -> pd.DataFrame:
    """True at the best mean of each column (all ties marked)."""
    best = means.max() if higher_is_better else means.min()
    return means.eq(best, axis=1) & means.notna()


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

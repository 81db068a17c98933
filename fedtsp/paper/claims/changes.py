"""How the verdicts moved from one profile's claims to another's (e.g. `cpu` to `evidence`).

Both sides are the committed `results/<profile>/claims.csv`. A part is the same part on both
sides when its claim, scope and comparison match, the comparison read without how its
rival was chosen: "FedTSP-MiniLM - FedTGP (strongest of 3)", where the data chose FedTGP,
and "FedTSP-MiniLM - FedTGP", named in advance by an analysis plan, are one part; a part
with another rival is another part. What moved is said from the two rows alone: seeds, how
the rival was chosen, interval width, convergence, testability.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pandas as pd

from fedtsp.core.errors import UserError
from fedtsp.paper.claims.registry import CLAIMS
from fedtsp.paper.claims.report import (
    bottom_line,
    effect_text,
    findings_table,
    profile_setting,
    read_findings_csv,
    summary_table,
)
from fedtsp.paper.claims.rule import NOT_TESTABLE
from fedtsp.paper.tables import to_markdown

_NOT_CONVERGED = "not converged"
_STRONGEST = re.compile(r" \((strongest of \d+)\)")  # the data chose the rival


def read_claims(results_root: str | Path, profile: str) -> pd.DataFrame:
    """The profile's tested parts, as its notebooks last wrote them (`claims.csv`)."""
    path = Path(results_root) / profile / "claims.csv"
    if not Path(results_root).is_dir():  # most likely run from another folder
        raise UserError(
            f"there is no results folder {str(results_root)!r} in {Path.cwd()}: run from the "
            "repository's root or give --results"
        )
    if not path.is_file():
        raise UserError(
            f"{path} does not exist: profile {profile!r} has no claims yet; "
            f"run `fedtsp reproduce --profile {profile}` first"
        )
    return read_findings_csv(path)


def part_identity(comparison: str) -> tuple[str, str]:
    """(the comparison without how its rival was chosen, how: "the strongest of N" where
    the data chose it, else "named in advance")."""
    found = _STRONGEST.search(comparison)
    chosen = f"the {found[1]}" if found else "named in advance"
    return _STRONGEST.sub("", comparison), chosen


def _keyed(frame: pd.DataFrame) -> pd.DataFrame:
    names = [part_identity(c) for c in frame["comparison"]]
    return frame.assign(
        part=[f"{s}: {n}" for s, (n, _) in zip(frame["scope"], names, strict=True)],
        chosen=[c for _, c in names],
    )


def what_moved(before: Any, after: Any) -> str:
    """The differences between a part's two rows (`itertuples` rows of `_keyed` frames)
    that bear on its verdict, in words."""
    said = []
    if int(before.n) != int(after.n):
        said.append(f"seeds {int(before.n)} → {int(after.n)}")
    if before.chosen != after.chosen:
        said.append(f"rival {before.chosen} → {after.chosen}")
    widths = [(r.ci_high - r.ci_low) / 2 for r in (before, after)]
    if not any(pd.isna(w) for w in widths):
        said.append(f"interval ± {widths[0]:.2f} → ± {widths[1]:.2f}")
    was, now = (_NOT_CONVERGED in str(r.reason) for r in (before, after))
    if was != now:
        said.append("converged now" if was else "no longer converged")
    if before.verdict == NOT_TESTABLE and after.verdict != NOT_TESTABLE:
        said.append(f"testable now (was: {before.reason})")
    if after.verdict == NOT_TESTABLE:
        said.append(f"not testable: {after.reason}")
    return "; ".join(said)


def _side(row: Any) -> str:
    return f"{row.verdict}: {effect_text(row)} (n = {int(row.n)})"


def verdict_changes(
    before: pd.DataFrame, after: pd.DataFrame, names: tuple[str, str]
) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """Three tables: every claim's verdict on both sides; each part whose verdict changed,
    with both sides and what moved; the parts only one side tested."""
    first, second = names
    verdicts = pd.DataFrame(
        {
            "id": [c.id for c in CLAIMS],
            "claim": [c.claim for c in CLAIMS],
            first: summary_table(before)["verdict"],
            second: summary_table(after)["verdict"],
        }
    )
    verdicts["changed"] = (verdicts[first] != verdicts[second]).map({True: "yes", False: ""})
    sides = _keyed(before), _keyed(after)
    keys = ["claim", "part"]
    both = sides[0].merge(sides[1], on=keys)[keys]
    pairs = zip(*(both.merge(s, on=keys).itertuples() for s in sides), strict=True)
    rows = [
        {"claim": old.claim, "part": old.part, first: _side(old), second: _side(new)}
        | {"what moved": what_moved(old, new)}
        for old, new in pairs
        if old.verdict != new.verdict
    ]
    tested = [set(zip(s["claim"], s["part"], strict=True)) for s in sides]
    alone = [
        {"claim": r.claim, "part": r.part, "tested at": name, "verdict": _side(r)}
        for side, other, name in ((sides[0], tested[1], first), (sides[1], tested[0], second))
        for r in side.itertuples()
        if (r.claim, r.part) not in other
    ]
    return (
        verdicts,
        pd.DataFrame(rows, columns=["claim", "part", first, second, "what moved"]),
        pd.DataFrame(alone, columns=["claim", "part", "tested at", "verdict"]),
    )


def _check_ids(ids: list[str]) -> None:
    known = [c.id for c in CLAIMS]
    unknown = [i for i in ids if i not in known]
    if unknown:
        raise UserError(f"unknown claim {unknown[0]!r}; choose from {', '.join(known)}")


def changes_markdown(results_root: str | Path, before: str, after: str, ids: list[str]) -> str:
    """`fedtsp claims --profile AFTER --against BEFORE [ID ...]`: the three tables of
    `verdict_changes` as Markdown, for the named claims or all of them."""
    _check_ids(ids)
    frames = read_claims(results_root, before), read_claims(results_root, after)
    verdicts, parts, alone = verdict_changes(*frames, names=(before, after))
    if ids:
        verdicts, parts, alone = (t[t[t.columns[0]].isin(ids)] for t in (verdicts, parts, alone))
    changed = int((verdicts["changed"] == "yes").sum())
    lines = [
        f"# Verdicts at `{after}` against `{before}`",
        "",
        f"{changed} of {len(verdicts)} claims changed verdict; {len(parts)} parts tested on "
        f"both sides changed theirs.",
        "",
        to_markdown(verdicts),
        "",
        "## Parts whose verdict changed",
        "",
        to_markdown(parts) if len(parts) else "(none)",
    ]
    if len(alone):
        lines += ["", "## Parts tested on one side only", "", to_markdown(alone)]
    return "\n".join(lines) + "\n"


def claims_markdown(results_root: str | Path, profile: str, ids: list[str]) -> str:
    """`fedtsp claims --profile P [ID ...]`: the bottom line and every claim's verdict, or
    the named claims' parts with effect, interval, seeds and verdict."""
    _check_ids(ids)
    frame = read_claims(results_root, profile)
    if ids:
        return to_markdown(findings_table(frame[frame["claim"].isin(ids)])) + "\n"
    summary = summary_table(frame)
    bottom = bottom_line(frame, summary, profile_setting(profile))
    return "\n\n".join([*bottom, to_markdown(summary)]) + "\n"

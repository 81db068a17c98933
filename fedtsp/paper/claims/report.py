"""The claims' tables: per notebook, and `results/<profile>/claims.md` over all of them."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from fedtsp.core.atomic import atomic_write_text
from fedtsp.paper.claims.findings import control_part
from fedtsp.paper.claims.registry import BY_ID, CLAIMS
from fedtsp.paper.claims.rule import (
    ALPHA,
    CONTRADICTED,
    EQUIVALENT,
    HOLDS,
    NOT_SEPARATED,
    NOT_TESTABLE,
    RULE,
    VERDICTS,
    Finding,
    overall,
)
from fedtsp.paper.statistics import summarize
from fedtsp.paper.tables import to_csv, to_markdown

# The rule is stated once (claims.md, docs/evidence.md); a notebook links to it, from its
# executed copy in papermill_runs/<profile>/ (the only copy with outputs).
RULE_LINK = (
    "Verdicts by the one decision rule of every notebook: "
    "[docs/evidence.md, The decision rule](../../docs/evidence.md#the-decision-rule)."
)


def findings_frame(findings: Iterable[Finding]) -> pd.DataFrame:
    """One row per finding, numbers in their own columns (the CSV form)."""
    columns = ["claim", "scope", "comparison", "unit", "mean", "std", "n", "ci_low", "ci_high"]
    columns += ["margin", "p_holm", "verdict", "reason"]
    return pd.DataFrame([f.row() for f in findings], columns=columns)


def effect_text(row: Any) -> str:
    """ "+1.23 [-0.40, +2.86] points" from a findings-frame row; "-" without a value."""
    if pd.isna(row.mean):
        return "-"
    decimals = 3 if row.unit == "" else 1 if row.unit == "rounds" else 2
    interval = (
        f" [{row.ci_low:+.{decimals}f}, {row.ci_high:+.{decimals}f}]"
        if not pd.isna(row.ci_low)
        else ""
    )
    unit = f" {row.unit}" if isinstance(row.unit, str) and row.unit else ""
    return f"{row.mean:+.{decimals}f}{interval}{unit}"


def findings_table(frame: pd.DataFrame) -> pd.DataFrame:
    """The readable table of findings: claim, part, effect [95 % CI], n, margin, Holm p,
    verdict, why."""
    return pd.DataFrame(
        {
            "claim": frame["claim"],
            "part": frame["scope"] + ": " + frame["comparison"],
            "effect [95 % CI]": [effect_text(r) for r in frame.itertuples()],
            "n": frame["n"].astype(int),
            "margin": [_number(m, "±{:g}") for m in frame["margin"]],
            "Holm p": [_number(p, "{:.3f}") for p in frame["p_holm"]],
            "verdict": frame["verdict"],
            "why": frame["reason"].fillna(""),
        }
    )


def _number(value: Any, fmt: str) -> str:
    return "-" if pd.isna(value) else fmt.format(value)


def summary_table(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per registered claim: its verdict and how its parts fell."""
    rows = []
    for claim in CLAIMS:
        parts = frame[frame["claim"] == claim.id]
        counts = parts["verdict"].value_counts()
        tally = ", ".join(f"{counts[v]} {v}" for v in VERDICTS if v in counts)
        rows.append(
            {
                "id": claim.id,
                "paper": claim.paper,
                "claim": claim.claim,
                "verdict": overall(parts["verdict"]) if len(parts) else NOT_TESTABLE,
                "parts": tally or f"not run ({claim.notebook} wrote no findings)",
            }
        )
    return pd.DataFrame(rows)


# How the bottom line names each verdict, in the order it says them.
_SAID = (
    (HOLDS, "Hold"),
    (CONTRADICTED, "Contradicted"),
    (
        EQUIVALENT,
        "Equivalent (a measured no difference, inside ± the margin: the advantage the paper "
        "claims is not there at this scale)",
    ),
    (NOT_SEPARATED, "Not separated (after Holm within the claim, the seeds decide neither way)"),
    (NOT_TESTABLE, "Not testable here"),
)
_MOST_PARTS = 3  # parts quoted per claim; the rest are in the table below


def bottom_line(frame: pd.DataFrame, summary: pd.DataFrame, setting: str) -> list[str]:
    """The claims file's first paragraph, from the findings alone: how many claims fall
    under each verdict at `setting`, then per verdict each claim with the parts that
    decided it (effect, 95 % interval, paired seeds) or, where none could be tested, why."""
    verdicts = dict(zip(summary["id"], summary["verdict"], strict=True))
    counts = pd.Series(list(verdicts.values())).value_counts()
    tally = ", ".join(f"{counts[v]} {v}" for v, _ in _SAID if v in counts)
    lines = [f"At {setting}, of {len(verdicts)} claims: {tally}."]
    for verdict, said in _SAID:
        claims = [c for c, v in verdicts.items() if v == verdict]
        if not claims:
            continue
        clauses = []
        for claim in claims:
            parts = frame[frame["claim"] == claim]
            if verdict == NOT_TESTABLE:
                clauses.append(f"{claim}{_why(parts)}")
                continue
            if verdict == NOT_SEPARATED:  # a part decided either way is worth a reader's eye
                decided = parts[~parts["verdict"].isin([NOT_SEPARATED, NOT_TESTABLE])]
                quoted = [
                    f"{_quote(r)} {r.verdict}" for r in decided.head(_MOST_PARTS).itertuples()
                ]
                extra, rest = len(decided) - len(quoted), len(parts) - len(decided)
                if extra:
                    quoted.append(f"{extra} more decided part{'s' * (extra > 1)} (below)")
                if rest:
                    quoted.append(f"{rest} part{'s' * (rest > 1)} not separated or not testable")
                clauses.append(claim + (f" ({'; '.join(quoted)})" if len(decided) else ""))
                continue
            decided = parts[parts["verdict"] == verdict]
            quoted = [_quote(r) for r in decided.head(_MOST_PARTS).itertuples()]
            more = len(decided) - len(quoted)
            quoted += [f"{more} more part{'s' * (more > 1)}"] if more > 0 else []
            clauses.append(f"{claim} ({BY_ID[claim].claim}): {'; '.join(quoted)}")
        lines.append(f"**{said}:** " + " · ".join(clauses) + ".")
    return lines


def _quote(row: Any) -> str:
    """A part as the bottom line quotes it: scope, comparison, effect, paired seeds and its
    caveat (runs short of their plateau, say); a decided difference whose whole interval
    lies inside the margin says so (it is small)."""
    caveat = f"; {row.reason}" if isinstance(row.reason, str) and row.reason else ""
    text = f"{row.scope}: {row.comparison} {effect_text(row)} (n = {int(row.n)}{caveat})"
    if row.verdict in (HOLDS, CONTRADICTED) and -row.margin < row.ci_low < row.ci_high < row.margin:
        text += f", the whole interval inside the ± {row.margin:g} margin"
    return text


def profile_setting(profile: str) -> str:
    """The profile's scale in a phrase: schedule, clients, data; FMCL's setting of its own."""
    from fedtsp.paper.profiles import fmcl_setting, load_profile, notebook_parameters, schedule

    try:
        prof = load_profile(profile, check_runs=False)  # its settings only: no torch
        fmcl = notebook_parameters(prof, "08_fmcl")
    except Exception:  # a profile of a test's own: its name is all there is
        return f"the `{profile}` profile"
    base = prof.base
    return (
        f"the `{profile}` profile's scale ({schedule(base['rounds'], base['local_epochs'])}, "
        f"{base['num_clients']} clients on {base['fraction']:.0%} of each dataset; FMCL's "
        f"claims: {fmcl_setting(fmcl)}; n = paired seeds)"
    )


def _why(parts: pd.DataFrame) -> str:
    """ " (reason)" for a claim no part of which could be tested: its parts' reasons, their
    first clause each, once."""
    reasons = [str(r).split(":")[0].split(";")[0] for r in parts["reason"] if str(r)]
    reasons = list(dict.fromkeys(reasons))
    return f" ({'; '.join(reasons)})" if reasons else " (no runs)"


def reading(findings: Sequence[Finding]) -> str:
    """Markdown that a notebook ends with: each claim's verdict and its parts."""
    frame = findings_frame(findings)
    lines = []
    for claim_id in dict.fromkeys(frame["claim"]):
        claim = BY_ID[claim_id]
        parts = frame[frame["claim"] == claim_id]
        lines.append(f"**{claim_id}** {claim.claim}: **{overall(parts['verdict'])}**.")
    body = to_markdown(findings_table(frame))
    return "\n\n".join([*lines, body, RULE_LINK])


# What a claim's verdict means for the paper, said after the verdict in a section's reading.
_MEANS = {
    HOLDS: "the data support the paper here",
    CONTRADICTED: "the data go against the paper here",
    EQUIVALENT: "a measured no difference: the advantage the paper claims is not there here",
    NOT_SEPARATED: "these seeds, Holm-corrected within the claim, decide it neither way",
    NOT_TESTABLE: "this setting cannot test it",
}


def part_reading(found: Finding) -> str:
    """One part of a claim in words: the paired effect with its interval and seeds, the
    verdict, and what a reader could misread about it (a significant difference inside the
    margin, a test that passes alone but not after Holm, an interval of no width)."""
    row = next(findings_frame([found]).itertuples())
    head = f"{found.scope}: {found.comparison}"
    if found.verdict == NOT_TESTABLE:
        return f"{head}: not testable here ({found.reason or 'no runs'})"
    text = f"{head} {effect_text(row)} (n = {found.effect.n}): {found.verdict}"
    effect, margin, notes = found.effect, found.margin, []
    inside = -margin < effect.ci_low and effect.ci_high < margin
    if found.kind == "above" and found.verdict in (HOLDS, CONTRADICTED) and inside:
        notes.append(f"the whole interval lies inside ± {margin:g}, so the difference is small")
    raw = dict(found.tests)
    first = {"above": "differs", "within": "equivalent", "no_worse": "no_worse"}[found.kind]
    if found.verdict == NOT_SEPARATED and raw.get(first, 1.0) < ALPHA:
        notes.append(f"p = {raw[first]:.3f} alone, {found.p_holm:.3f} after Holm within the claim")
    if effect.std == 0:
        notes.append(f"all {effect.n} seeds gave the same difference, so the interval has no width")
    if found.reason:
        notes.append(found.reason)
    return text + (f" ({'; '.join(notes)})" if notes else "")


def section_reading(findings: Sequence[Finding], claim_ids: Sequence[str]) -> str:
    """Markdown a notebook prints under a table or figure: for each claim it bears on, the
    verdict, what it means for the paper, and every part in words (`part_reading`)."""
    lines = []
    for claim_id in claim_ids:
        parts = [f for f in findings if f.claim == claim_id]
        if not parts:
            lines.append(f"**{claim_id}**: no findings (no runs at this profile).")
            continue
        verdict = overall(f.verdict for f in parts)
        means = _MEANS[verdict]
        if verdict == NOT_SEPARATED and all(f.verdict != NOT_SEPARATED for f in parts):
            means = "its parts point different ways"
        said = [f"**{claim_id}** ({BY_ID[claim_id].claim}): **{verdict}**, {means}."]
        lines.append("\n".join(said + [f"- {part_reading(f)}" for f in parts]))
    return "**Reading.** " + "\n\n".join(lines)


def controls_table(
    findings: Sequence[Finding], table2: pd.DataFrame, controls: pd.DataFrame, row2: str
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Table 2's semantic controls, readable and as numbers: each control's accuracy beside
    row (2)'s, and its F11 finding (the paired difference, the Holm p within F11, the
    verdict), so that this table and claims.md give each control the same verdict."""
    parts = {(f.scope, f.comparison): f for f in findings if f.claim == "F11"}
    rows, numbers = [], []
    for encoder, part in table2.groupby("text_encoder", sort=False):
        text = summarize(part.loc[part["row"] == row2, "best_acc"])
        dataset = str(part["dataset"].iloc[0])
        mine = controls[controls["text_encoder"] == encoder]
        for control, targets in mine.groupby("control", sort=False):
            found = parts[control_part(str(encoder), dataset, str(control))]
            acc = summarize(targets["best_acc"])
            cells, values = _paired_cells(found, "text - control")
            rows.append(
                {
                    "text encoder": encoder,
                    "targets": control,
                    "accuracy (%)": acc.cell(),
                    "row 2, text (%)": text.cell(),
                }
                | cells
            )
            numbers.append(
                {"text_encoder": encoder, "targets": control}
                | {f"control_{k}": v for k, v in acc.as_dict().items()}
                | values
            )
    return pd.DataFrame(rows), pd.DataFrame(numbers)


def _paired_cells(found: Finding, difference: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """A finding's table cells (the paired difference with its interval, the seeds, the
    Holm p, the verdict) and the same as numbers."""
    diff = found.effect
    cells = {
        f"{difference} [95 % CI]": f"{diff.mean:+.2f} {diff.interval()}".rstrip(" -"),
        "seeds paired": diff.n,
        "Holm p": _number(found.p_holm, "{:.3f}"),
        "verdict": found.verdict,
    }
    values = {f"difference_{k}": v for k, v in diff.as_dict().items()}
    return cells, values | {"p_holm": found.p_holm, "verdict": found.verdict}


def authors_table(
    findings: Sequence[Finding], runs: pd.DataFrame, methods: tuple[str, str]
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """F17 per dataset, readable and as numbers: the authors' runs and the paper's reading
    (``methods``, in that order) beside their paired difference and its verdict."""
    parts = {f.scope: f for f in findings if f.claim == "F17"}
    authors, paper = methods
    rows, numbers = [], []
    for ds, part in runs.groupby("dataset", sort=False):
        sides = {m: summarize(part.loc[part["method"] == m, "best_acc"]) for m in methods}
        cells, values = _paired_cells(parts[str(ds)], "difference")
        rows.append({"dataset": ds} | {f"{m} (%)": sides[m].cell() for m in methods} | cells)
        numbers.append(
            {"dataset": ds}
            | {f"authors_{k}": v for k, v in sides[authors].as_dict().items()}
            | {f"paper_{k}": v for k, v in sides[paper].as_dict().items()}
            | values
        )
    return pd.DataFrame(rows), pd.DataFrame(numbers)


def authors_reading(table: pd.DataFrame) -> str:
    """One sentence on `authors_table`: how far the authors' choices move FedTSP, per
    dataset, and what the rule makes of it."""
    said = "; ".join(
        f"{row['dataset']} {row['difference [95 % CI]']} points over {row['seeds paired']} "
        f"paired seeds ({row['verdict']})"
        for _, row in table.iterrows()
    )
    return (
        f"Reading: every choice of the authors' code at once moves FedTSP's best-round "
        f"accuracy by {said}; claim F17 holds where the 95 % interval lies inside its margin."
    )


def read_findings_csv(path: Path) -> pd.DataFrame:
    """A findings frame as a CSV of `findings_frame` (or `claims.csv`) holds it."""
    frame = pd.read_csv(path)
    for column in ("reason", "unit"):  # empty text reads back as NaN
        frame[column] = frame[column].astype(object).fillna("")
    return frame


def write_report(folder: Path, profile: str) -> Path:
    """Rewrite `<folder>/claims.md` and `claims.csv` from every `claims/<notebook>.csv`."""
    parts = [read_findings_csv(p) for p in sorted((folder / "claims").glob("*.csv"))]
    frame = pd.concat(parts, ignore_index=True) if parts else findings_frame([])
    frame = frame.reindex(columns=findings_frame([]).columns)  # older files lack p_holm
    summary = summary_table(frame)
    registry = pd.DataFrame(
        [
            {"id": c.id, "paper's evidence": c.evidence, "our test": c.test, "notebook": c.notebook}
            for c in CLAIMS
        ]
    )
    bottom = bottom_line(frame, summary, profile_setting(profile))
    lines = [
        f"# Claims and verdicts (profile `{profile}`)",
        "",
        "Generated by the notebooks from the run store (`fedtsp.paper.claims`); do not edit.",
        "",
        "## Bottom line",
        "",
        *[f"{line}\n" for line in bottom],
        f"**Rule.** {RULE}",
        "",
        to_markdown(summary),
        "",
        "## Each claim's evidence and test",
        "",
        to_markdown(registry),
        "",
        "## Every tested part",
        "",
        to_markdown(findings_table(frame)) if len(frame) else "(none yet)",
        "",
    ]
    atomic_write_text(folder / "claims.md", "\n".join(lines))
    merged = frame.merge(
        summary[["id", "verdict"]].rename(columns={"id": "claim", "verdict": "claim_verdict"}),
        on="claim",
        how="left",
    )
    atomic_write_text(folder / "claims.csv", to_csv(merged))
    atomic_write_text(folder / "claims_summary.md", to_markdown(summary) + "\n")
    atomic_write_text(folder / "claims_rule.md", RULE + "\n")  # docs/evidence.md shows it
    atomic_write_text(folder / "claims_bottom_line.md", "\n\n".join(bottom) + "\n")  # README
    return folder / "claims.md"

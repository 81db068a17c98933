"""The papers' claims, the comparison that tests each one, and a verdict by one stated rule.

`CLAIMS` (from `claims.toml`) lists what FedTSP and FMCL claim, with the paper's evidence
and our test. Each notebook turns its own runs into `Finding`s with the function named
after it (`semantics`, `main_table`, ...; `findings.py`): one paired comparison by seed per
part of a claim, with the effect's 95 % interval and the verdict of `RULE` (`rule.py`). The
notebook's `ResultsWriter.claims` stores them and rewrites `results/<profile>/claims.md`
(+ `claims.csv`) from every notebook's findings (`report.py`), so no verdict is typed.
"""

from fedtsp.paper.claims.findings import (
    ablations,
    authors_runs,
    context,
    fedtsp_labels,
    fmcl,
    homogeneous,
    main_table,
    privacy,
    semantics,
    writers,
)
from fedtsp.paper.claims.registry import BY_ID, CLAIMS, Claim
from fedtsp.paper.claims.report import (
    authors_reading,
    authors_table,
    controls_table,
    findings_frame,
    reading,
    section_reading,
    write_report,
)
from fedtsp.paper.claims.rule import (
    ALPHA,
    CONTRADICTED,
    EQUIVALENT,
    HOLDS,
    LEARNS,
    MARGINS,
    NOT_SEPARATED,
    NOT_TESTABLE,
    RULE,
    TOLERANCE,
    VERDICTS,
    Finding,
    compare,
    holm,
    judge,
    learning_threshold,
    overall,
    verdict,
)

__all__ = [
    "ALPHA",
    "BY_ID",
    "CLAIMS",
    "CONTRADICTED",
    "EQUIVALENT",
    "HOLDS",
    "LEARNS",
    "MARGINS",
    "NOT_SEPARATED",
    "NOT_TESTABLE",
    "RULE",
    "TOLERANCE",
    "VERDICTS",
    "Claim",
    "Finding",
    "ablations",
    "authors_reading",
    "authors_runs",
    "authors_table",
    "compare",
    "context",
    "controls_table",
    "fedtsp_labels",
    "findings_frame",
    "fmcl",
    "holm",
    "homogeneous",
    "judge",
    "learning_threshold",
    "main_table",
    "overall",
    "privacy",
    "reading",
    "section_reading",
    "semantics",
    "verdict",
    "write_report",
    "writers",
]

"""The registry of claims (`claims.toml`): what each paper claims, its evidence, our test."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from fedtsp.paper.claims.findings import PROTOTYPE_BASELINES
from fedtsp.paper.claims.rule import TOLERANCE
from fedtsp.paper.profiles import tomllib
from fedtsp.paper.reported import TABLE1


@dataclass(frozen=True)
class Claim:
    """One claim of a paper: what it says, the paper's evidence, and our test."""

    id: str
    paper: str
    notebook: str
    claim: str
    evidence: str
    test: str


def paper_gains(alpha: float | None = None) -> dict[tuple[str, float], float]:
    """The paper's gain of its best FedTSP over the best prototype baseline, per column."""
    columns = TABLE1["FedProto"].keys()
    return {
        col: max(TABLE1[m][col] for m in ("FedTSP-CLIP", "FedTSP-BERT"))
        - max(TABLE1[m][col] for m in PROTOTYPE_BASELINES)
        for col in columns
        if alpha is None or col[1] == alpha
    }


def _gain_range() -> str:
    gains = paper_gains().values()
    return f"{min(gains):+.2f} to {max(gains):+.2f} points"


def _gain_by_alpha() -> str:
    low, high = paper_gains(0.1), paper_gains(1.0)
    parts = [
        f"{ds} {low[(ds, 0.1)]:+.2f} at 0.1 vs {high[(ds, 1.0)]:+.2f} at 1.0"
        for ds in dict.fromkeys(ds for ds, _ in low)
    ]
    return "; ".join(parts)


REGISTRY = Path(__file__).with_name("claims.toml")


def load_claims(path: Path = REGISTRY) -> tuple[Claim, ...]:
    """The claims of `path` in file order, their {placeholders} filled from data."""
    with open(path, "rb") as fh:
        table = tomllib.load(fh)
    values = {
        "gain_range": _gain_range(),
        "gain_by_alpha": _gain_by_alpha(),
        "tolerance": f"{TOLERANCE:g}",
    }
    return tuple(
        Claim(
            claim_id,
            entry["paper"],
            entry["notebook"],
            entry["claim"].format(**values),
            entry["evidence"].format(**values),
            entry["test"].format(**values),
        )
        for claim_id, entry in table.items()
    )


CLAIMS = load_claims()
BY_ID = {c.id: c for c in CLAIMS}

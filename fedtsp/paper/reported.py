"""Numbers the FedTSP paper reports, for side-by-side comparison (PROTOCOL.md)."""

from __future__ import annotations

# Table 1, HtFE9, 20 clients, best-round mean local accuracy (%): method -> (dataset, alpha) -> value.
_DATASETS = [(d, a) for d in ("cifar10", "cifar100", "tinyimagenet") for a in (0.1, 0.5, 1.0)]
_TABLE1_ROWS = {
    "FedProto": (85.81, 61.53, 54.34, 41.07, 24.48, 18.89, 31.52, 16.96, 12.51),
    "FedTGP": (85.73, 61.60, 53.96, 41.37, 24.43, 18.33, 31.16, 15.70, 11.80),
    "AlignFed": (85.80, 62.43, 56.59, 41.88, 24.22, 18.22, 30.77, 14.54, 10.73),
    "FedTSP-CLIP": (87.34, 64.76, 58.62, 45.61, 26.92, 20.91, 34.82, 18.33, 14.43),
    "FedTSP-BERT": (87.52, 65.31, 58.42, 46.08, 26.66, 20.53, 33.47, 18.21, 14.41),
}
TABLE1: dict[str, dict[tuple[str, float], float]] = {
    method: dict(zip(_DATASETS, values, strict=True)) for method, values in _TABLE1_ROWS.items()
}


def table1_value(method: str, dataset: str, alpha: float) -> float | None:
    """The paper's Table 1 number, or None where it reports none (or for our MiniLM variant)."""
    return TABLE1.get(method, {}).get((dataset, float(alpha)))

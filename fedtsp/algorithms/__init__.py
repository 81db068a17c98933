"""Federated algorithms, one file per method, all on the interface in `base`."""

from fedtsp.algorithms import (  # noqa: F401  (registers the methods)
    alignfed,
    feddistill,
    fedgen,
    fedgh,
    fedkd,
    fedmrl,
    fedproto,
    fedtgp,
    fedtsp,
    fml,
    lgfedavg,
    local,
)
from fedtsp.algorithms.base import (
    ALGORITHMS,
    Algorithm,
    Message,
    RunContext,
    algorithm_names,
    get_algorithm,
    options_help,
    resolve_options,
)

__all__ = [
    "ALGORITHMS",
    "Algorithm",
    "Message",
    "RunContext",
    "algorithm_names",
    "get_algorithm",
    "options_help",
    "resolve_options",
]

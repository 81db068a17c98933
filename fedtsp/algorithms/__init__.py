"""Federated algorithms, one file per method, all on the interface in `base`."""

from fedtsp.algorithms import (  # noqa: F401  (registers the methods)
    alignfed,
    cfl,
    fedavg,
    fedbabu,
    feddistill,
    fedetf,
    fedfa,
    fedgen,
    fedgh,
    fedkd,
    fedmrl,
    fedpac,
    fedpcl,
    fedproto,
    fedtgp,
    fedtsp,
    fixed_clusters,
    fmcl,
    fml,
    ifca,
    lgfedavg,
    local,
    pacfl,
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

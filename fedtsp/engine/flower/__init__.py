"""Run fedtsp's federated algorithms on Flower (https://flower.ai), Message API.

``run_flower(config, engine="flower-sim" | "flower-processes", ...)`` runs one experiment
on Flower's simulation engine (Ray backend) or as separate SuperLink / SuperNode processes
on 127.0.0.1, and writes the same kind of run record as ``fedtsp.engine.simulation``. The
ServerApp and ClientApp live in :mod:`fedtsp.engine.flower.apps`; the engine-independent server
loop and node runtime in :mod:`fedtsp.engine.flower.core`. Needs the ``flower`` extra.
"""

from fedtsp.engine.flower.core import (
    ENGINES,
    FAILURE_POLICIES,
    ClientFailureError,
    prepare_workdir,
)
from fedtsp.engine.flower.launch import (
    LocalFederation,
    run_flower,
    run_processes,
    run_simulation_engine,
)

__all__ = [
    "ENGINES",
    "FAILURE_POLICIES",
    "ClientFailureError",
    "LocalFederation",
    "prepare_workdir",
    "run_flower",
    "run_processes",
    "run_simulation_engine",
]

"""Run fedtsp's federated algorithms on Flower (https://flower.ai), Message API.

``run_flower(config, engine="flower-sim" | "flower-processes", ...)`` runs one experiment
on Flower's simulation engine (Ray backend) or as separate SuperLink / SuperNode processes
on 127.0.0.1, and writes the same kind of run record as ``fedtsp.engine.simulation``. The
ServerApp and ClientApp live in :mod:`fedtsp.engine.flower.apps` (the server drives the run
with the engine's one driver, ``fedtsp.engine.driver``); the work folder and the node runtime
in :mod:`fedtsp.engine.flower.workdir`. Needs the ``flower`` extra.
"""

from fedtsp.engine.flower.launch import (
    LocalFederation,
    run_flower,
    run_processes,
    run_simulation_engine,
)
from fedtsp.engine.flower.workdir import (
    ENGINES,
    FAILURE_POLICIES,
    ClientFailureError,
    prepare_workdir,
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

"""The Flower work folder and what a node builds from it.

A Flower run is split the way a real federation is:

* the *work folder* (written by :func:`prepare_workdir` from a config and a dataset) holds
  ``run.json`` (config, dataset facts, the run's key), ``server.npz`` (the set-up RNG state
  of ``engine.build.initial_models``; nothing of any client) and one ``node-<i>.npz`` per
  client with that client's train/test images and starting model, built as the simulator
  builds it: what is handed to each node;
* the server (``apps.serve``, inside Flower's ServerApp) builds the run's server side from
  ``run.json`` and ``server.npz`` (:func:`server_run`) and drives it with the engine's one
  driver (``engine.driver.drive``) over a Flower transport;
* a node (:class:`NodeRuntime`, inside Flower's ClientApp) holds one client and the
  method's client half: data, model, optimiser and client state, kept in the node's Flower
  ``Context.state`` between rounds (``Client.state_dict``, as in a checkpoint).

Seeding is the simulator's: each client's round starts from ``derive_seed(seed, t)``
(``client_round.clients_round``) and the server reseeds before its step, so per-round
accuracies equal the simulator's.
"""

from __future__ import annotations

import io
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedtsp.algorithms import Message
from fedtsp.algorithms.base import ClientHalf
from fedtsp.algorithms.clients import Client
from fedtsp.core.atomic import atomic_write_bytes
from fedtsp.core.config import FAILURE_POLICIES, ROUND_TIMEOUT, ConfigError, RunConfig
from fedtsp.core.errors import RunFailedError
from fedtsp.data import ImageDataset, device_images
from fedtsp.engine.build import (
    Datasets,
    client_data,
    client_half,
    client_model,
    data_identity,
    initial_models,
    load_datasets,
    make_client,
    run_context,
    server_half,
)
from fedtsp.engine.client_round import (
    ClientReply,
    RoundWork,
    SetupReply,
    clients_round,
    receive_client,
    restore_client,
    set_up_client,
)
from fedtsp.engine.driver import Run
from fedtsp.engine.loop import check_every, round_work
from fedtsp.engine.runspec import method_feature_dim, run_key

log = logging.getLogger("fedtsp.engine.flower")

ENGINES = ("flower-sim", "flower-processes")
INITIAL = "initial."  # node file entries of the client's starting model
SETUP_RNG = "setup_rng"  # the set-up RNG state (torch.save bytes as uint8)


class ClientFailureError(RunFailedError, RuntimeError):
    """A client (node) did not answer, or answered with an error, during a Flower run."""


# ---- serialisation ---------------------------------------------------------------------
def to_bytes(obj: Any) -> bytes:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def from_bytes(blob: bytes, device: str | torch.device = "cpu") -> Any:
    # Pickled objects come only from this run's own ServerApp / node state: the same trust
    # boundary as the app code Flower ships to every node.
    return torch.load(io.BytesIO(blob), map_location=device, weights_only=False)


def message_to_arrays(message: Message | None) -> dict[str, np.ndarray]:
    """An algorithm message (dict of tensors) as numpy arrays for a Flower ArrayRecord."""
    out = {}
    for name, value in (message or {}).items():
        if not torch.is_tensor(value):
            raise TypeError(f"message entry {name!r} is a {type(value).__name__}, not a tensor")
        out[name] = value.detach().cpu().numpy()
    return out


def arrays_to_message(arrays: dict[str, np.ndarray], device: torch.device) -> Message:
    # np.array copies: Flower's buffers may be read-only, torch wants writable memory.
    return {k: torch.from_numpy(np.array(v)).to(device) for k, v in arrays.items()}


# ---- the work folder --------------------------------------------------------------------
def engine_key(config: RunConfig, datasets: dict[str, ImageDataset], engine: str) -> str:
    """The run's key: the simulator's key material plus the engine, for provenance."""
    return run_key(config, data_identity(config, datasets) | {"engine": engine})


def check_flower_options(
    engine: str, on_failure: str, round_timeout: float, checkpoint_every: int | None
) -> None:
    """The Flower run's own options, each a one-line ConfigError before any work."""
    if engine not in ENGINES:
        raise ConfigError(f"engine={engine!r} is invalid; choose one of {', '.join(ENGINES)}")
    if on_failure not in FAILURE_POLICIES:
        raise ConfigError(
            f"on_failure={on_failure!r} is invalid; choose one of {', '.join(FAILURE_POLICIES)}"
        )
    if not round_timeout > 0:
        raise ConfigError(f"round_timeout={round_timeout} is invalid; must be > 0 seconds")
    check_every(checkpoint_every)


def prepare_workdir(
    config: RunConfig,
    dataset: Datasets,
    workdir: str | Path,
    *,
    out: str | Path,
    engine: str,
    on_failure: str = FAILURE_POLICIES[0],
    round_timeout: float = ROUND_TIMEOUT,
    resume: bool = False,
    checkpoint_every: int | None = None,
    stop_after: int | None = None,
    key: str | None = None,
) -> dict[str, Any]:
    """Write run.json, server.npz and node-<i>.npz (data and starting model); return
    run.json's content. The config is checked by the caller (``run_flower``, ``check_run``).

    ``resume``: continue from the run's checkpoint, if there is one. ``checkpoint_every``:
    as the simulator's (unset: automatic, near 1 % of the wall time). ``stop_after``: end
    the run after that many rounds, as an interruption would (the checkpoint stays).
    """
    check_flower_options(engine, on_failure, round_timeout, checkpoint_every)
    feature_dim = method_feature_dim(config)
    workdir = Path(workdir).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    datasets = load_datasets(config, None, dataset)
    cdata = client_data(config, datasets)
    classes = len(cdata.class_names)
    models, rng = initial_models(config, classes, feature_dim, cdata.channels, cdata.image_size)
    rng_bytes = np.frombuffer(to_bytes(rng), dtype=np.uint8)
    for i, model in enumerate(models):
        (train_x, train_y), (test_x, test_y) = cdata.train[i], cdata.test[i]
        arrays = {"train_x": train_x, "train_y": train_y, "test_x": test_x, "test_y": test_y}
        arrays |= {INITIAL + k: v.cpu().numpy() for k, v in model.state_dict().items()}
        arrays[SETUP_RNG] = rng_bytes
        # The global test set goes where it is scored: every node (global_eval_every), or
        # client 0, whose copy is the global model after every broadcast (gfl).
        due = config.global_eval_every > 0 or round_work(config, 0).gfl_client == i
        if due and cdata.global_test is not None:
            arrays |= {"global_x": cdata.global_test[0], "global_y": cdata.global_test[1]}
        _save_npz(workdir / f"node-{i}.npz", arrays)
    _save_npz(workdir / "server.npz", {SETUP_RNG: rng_bytes})
    run = {
        "key": key or engine_key(config, datasets, engine),
        "engine": engine,
        "config": config.to_dict(),
        "feature_dim": feature_dim,
        "dataset": cdata.description | {"channels": cdata.channels, "image_size": cdata.image_size},
        "partition": cdata.stats,
        "groups": cdata.groups,
        "out": str(Path(out).resolve()),
        "on_failure": on_failure,
        "round_timeout": float(round_timeout),
        "resume": bool(resume),
        "checkpoint_every": checkpoint_every,
        "stop_after": stop_after,
    }
    atomic_write_bytes(workdir / "run.json", json.dumps(run, indent=1, default=str).encode())
    return run


def _save_npz(path: Path, arrays: dict[str, np.ndarray]) -> None:
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    atomic_write_bytes(path, buffer.getvalue())


def load_run(workdir: str | Path) -> dict[str, Any]:
    path = Path(workdir) / "run.json"
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist; prepare the work folder first")
    return json.loads(path.read_text())


def _build_model(run: dict[str, Any], config: RunConfig, index: int) -> torch.nn.Module:
    meta = run["dataset"]
    classes = len(meta["classes"])
    return client_model(
        config, index, classes, run["feature_dim"], meta["channels"], meta["image_size"]
    )


# ---- the server ---------------------------------------------------------------------------
@dataclass
class Failure:
    client: int
    node_id: int
    round: int
    reason: str

    def sentence(self) -> str:
        return (
            f"client {self.client} (Flower node {self.node_id}) failed in round {self.round}: "
            f"{self.reason}"
        )


def server_run(workdir: str | Path) -> tuple[dict[str, Any], Run]:
    """run.json's content and the run's server side, as ``prepare_workdir`` left them."""
    spec = load_run(workdir)
    config, meta = RunConfig.from_dict(spec["config"]), spec["dataset"]
    with np.load(Path(workdir) / "server.npz") as arrays:
        rng = from_bytes(arrays[SETUP_RNG].tobytes())
    ctx = run_context(config, meta["classes"], spec["feature_dim"], spec["groups"])
    dataset = {k: meta[k] for k in ("name", "source", "checksum", "classes")}
    run = Run(
        config,
        spec["key"],
        server_half(config, ctx),
        rng,
        dataset,
        spec["partition"],
        spec["feature_dim"],
    )
    return spec, run


# ---- a node -------------------------------------------------------------------------------
@dataclass
class NodeRuntime:
    """One client on one node: data and starting model from its node file; set up here
    (``blob`` None) or restored from a saved state (``blob``)."""

    config: RunConfig
    client: Client
    half: ClientHalf  # the method's client half
    global_test: tuple[torch.Tensor, torch.Tensor] | None
    setup_reply: SetupReply | None = None  # what a fresh set-up tells the server

    @classmethod
    def build(
        cls, run: dict[str, Any], index: int, data_file: str | Path, blob: bytes | None
    ) -> NodeRuntime:
        cfg = RunConfig.from_dict(run["config"])
        path = Path(data_file)
        if not path.exists():
            raise FileNotFoundError(f"node data file {path} (client {index}) does not exist")
        device = torch.device(cfg.device)
        with np.load(path) as arrays:

            def tensors(name: str) -> tuple[torch.Tensor, torch.Tensor]:
                x = device_images(arrays[f"{name}_x"], device, cfg.channels_last)
                return x, torch.from_numpy(arrays[f"{name}_y"]).long().to(device)

            train_x, train_y = tensors("train")
            test_x, test_y = tensors("test")
            global_test = tensors("global") if "global_x" in arrays.files else None
            n = len(INITIAL)
            initial = {k[n:]: torch.from_numpy(arrays[k]) for k in arrays.files if k[:n] == INITIAL}
            rng = from_bytes(arrays[SETUP_RNG].tobytes())
        classes = run["dataset"]["classes"]
        model = _build_model(run, cfg, index)
        model.load_state_dict(initial)
        client = make_client(cfg, index, model, (train_x, train_y), (test_x, test_y), len(classes))
        half = client_half(cfg, run_context(cfg, classes, run["feature_dim"], run["groups"]))
        node = cls(cfg, client, half, global_test)
        if blob is None:
            node.setup_reply = set_up_client(half, client, cfg, rng)
        else:
            restore_client(half, client, cfg, rng, from_bytes(blob, cfg.device))
        return node

    def blob(self) -> bytes:
        """The client's persistent state (``Client.state_dict``, as in a checkpoint)."""
        return to_bytes(self.client.state_dict())

    def round(self, work: RoundWork, message: Message | None) -> ClientReply:
        """receive -> evaluate -> (train -> upload): this client's half of one round."""
        received = 0.0 if message is None else receive_client(self.half, self.client, message)
        reply = clients_round(self.half, [self.client], self.config, work, self.global_test)
        reply[self.client.index].timings["broadcast"] = received
        return reply[self.client.index]

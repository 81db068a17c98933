"""Engine-independent pieces of the Flower adapter: the work folder, the server loop, the node.

A Flower run is split the way a real federation is:

* the *work folder* (written by :func:`prepare_workdir` from a config and a dataset) holds
  ``run.json`` (config, dataset facts, the run's key), ``server.npz`` (each client's label
  vector, which some methods' set-up reads; never images) and one ``node-<i>.npz`` per
  client with that client's train/test images: the partition handed to each node;
* the server (:class:`ServerLoop`, run inside Flower's ServerApp) owns the method's server
  half and its state (e.g. FedTSP's text encoder and prompts), builds every client's
  initial model exactly as the in-process simulator does and ships it to its node once;
  the rounds are the engine's :class:`fedtsp.engine.loop.RoundLoop`, the simulator's;
* a node (:class:`NodeRuntime`, run inside Flower's ClientApp) holds one client and the
  method's client half: data, model, optimiser and client state, kept in the node's Flower
  ``Context.state`` between rounds (and cached while the same process serves the node).

Seeding is the simulator's: the global RNG is reseeded with ``derive_seed(seed, t)`` at the
start of round t (on the server and on every node) and each client's batch order comes from
``derive_seed(seed, t, i)``, so per-round accuracies equal the simulator's whenever local
training draws nothing from the global RNG (no dropout).
"""

from __future__ import annotations

import io
import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedtsp.algorithms import Algorithm, Message, get_algorithm, resolve_options
from fedtsp.atomic import atomic_write_bytes
from fedtsp.clients import Client
from fedtsp.config import ConfigError, RunConfig
from fedtsp.data import ImageDataset, device_images
from fedtsp.engine.build import (
    Datasets,
    client_data,
    client_model,
    data_identity,
    load_datasets,
    make_client,
    resolve_feature_dim,
    run_context,
)
from fedtsp.engine.client_round import (
    ClientReply,
    RoundWork,
    evaluate_client,
    receive_client,
    train_client,
    upload_client,
)
from fedtsp.engine.loop import checkpoint_due, round_work
from fedtsp.engine.record import federated_record
from fedtsp.results import RunStore, json_default
from fedtsp.runspec import check_run, run_key
from fedtsp.seeding import derive_seed, seed_everything

log = logging.getLogger("fedtsp.flower")

ENGINES = ("flower-sim", "flower-processes")
FAILURE_POLICIES = ("stop", "continue")


class ClientFailureError(RuntimeError):
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


def prepare_workdir(
    config: RunConfig,
    dataset: Datasets,
    workdir: str | Path,
    *,
    out: str | Path,
    engine: str,
    on_failure: str = "stop",
    round_timeout: float = 3600.0,
    resume: bool = False,
    checkpoint_every: int = 1,
    stop_after: int | None = None,
) -> dict[str, Any]:
    """Write run.json, server.npz and node-<i>.npz; return run.json's content.

    ``resume``: continue from the run's checkpoint, if there is one. ``stop_after``: end
    the run after that many rounds, as an interruption would (the checkpoint stays).
    """

    if engine not in ENGINES:
        raise ConfigError(f"engine={engine!r} is invalid; choose one of {', '.join(ENGINES)}")
    if on_failure not in FAILURE_POLICIES:
        raise ConfigError(
            f"on_failure={on_failure!r} is invalid; choose one of {', '.join(FAILURE_POLICIES)}"
        )
    if not round_timeout > 0:
        raise ConfigError(f"round_timeout={round_timeout} is invalid; must be > 0 seconds")
    if checkpoint_every < 1:
        raise ConfigError(f"checkpoint_every={checkpoint_every} is invalid; must be >= 1")
    check_run(config)
    algorithm_cls = get_algorithm(config.algorithm)
    options = resolve_options(config.algorithm, config.algo_options)
    feature_dim = resolve_feature_dim(config, algorithm_cls, options)
    workdir = Path(workdir).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    datasets = load_datasets(config, None, dataset)
    cdata = client_data(config, datasets)
    for i in range(config.num_clients):
        (train_x, train_y), (test_x, test_y) = cdata.train[i], cdata.test[i]
        arrays = {"train_x": train_x, "train_y": train_y, "test_x": test_x, "test_y": test_y}
        # The global test set goes where it is scored: every node (global_eval_every), or
        # client 0, whose copy is the global model after every broadcast (gfl).
        due = config.global_eval_every > 0 or round_work(config, 0).gfl_client == i
        if due and cdata.global_test is not None:
            arrays |= {"global_x": cdata.global_test[0], "global_y": cdata.global_test[1]}
        _save_npz(workdir / f"node-{i}.npz", arrays)
    _save_npz(workdir / "server.npz", {f"train_y_{i}": y for i, (_, y) in enumerate(cdata.train)})
    run = {
        "key": engine_key(config, datasets, engine),
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
        "checkpoint_every": int(checkpoint_every),
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


def _client_blob(client: Client) -> bytes:
    """A client's persistent state: model weights, optimiser state, algorithm state."""
    return to_bytes(
        {
            "model": client.model.state_dict(),
            "optimizer": client.optimizer.state_dict() if client.optimizer else None,
            "state": client.state,  # modules (shared models, generators) pickled whole
            "model_seconds": client.model_seconds,
        }
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


@dataclass
class ServerLoop:
    """The server side of one run: algorithm state, the round loop, the run record."""

    workdir: Path
    run: dict[str, Any] = field(init=False)
    config: RunConfig = field(init=False)
    algorithm: Algorithm = field(init=False)
    initial_blobs: list[bytes] = field(init=False)
    first_broadcast: Message | None = field(init=False)

    def __post_init__(self) -> None:

        self.workdir = Path(self.workdir)
        self.run = load_run(self.workdir)
        self.config = RunConfig.from_dict(self.run["config"])
        cfg = self.config
        options = resolve_options(cfg.algorithm, cfg.algo_options)
        labels = np.load(self.workdir / "server.npz")
        meta = self.run["dataset"]
        # Same construction order as fedtsp.simulation.prepare, so that every model (and
        # any per-client state the method's set-up draws) starts from the same weights.
        # The server sees label vectors only: image tensors are empty placeholders.
        seed_everything(cfg.seed)
        device = torch.device(cfg.device)
        empty = torch.zeros(0, meta["channels"], meta["image_size"], meta["image_size"])
        clients = []
        for i in range(cfg.num_clients):
            model = _build_model(self.run, cfg, i)
            train_y = torch.from_numpy(labels[f"train_y_{i}"]).long().to(device)
            clients.append(
                Client(
                    i,
                    model,
                    empty.to(device),
                    train_y,
                    empty.to(device),
                    train_y[:0],
                    len(meta["classes"]),
                )
            )
        context = run_context(cfg, meta["classes"], self.run["feature_dim"], self.run["groups"])
        self.algorithm = get_algorithm(cfg.algorithm)(options, context)
        self.first_broadcast = self.algorithm.setup(clients)
        self.initial_blobs = [_client_blob(c) for c in clients]

    @property
    def store(self) -> RunStore:
        return RunStore(self.run["out"])

    def incomplete_path(self) -> Path:
        return Path(self.run["out"]) / "incomplete" / f"{self.run['key']}.json"

    def checkpoint_due(self, round_index: int) -> bool:
        run = self.run
        return checkpoint_due(self.config, round_index, run["checkpoint_every"], run["stop_after"])

    def save_checkpoint(
        self,
        round_index: int,
        client_blobs: dict[int, bytes],
        pending: dict[int, Message],
        history: list[dict[str, Any]],
    ) -> None:
        """The server's state, every node's state and the messages not yet received."""
        state = {
            "round": round_index,
            "clients": client_blobs,
            "algorithm": self.algorithm.state_dict(),
            "pending": pending,
            "history": history,
        }
        self.store.save_checkpoint(self.run["key"], state)

    def resume_state(self) -> dict[str, Any] | None:
        """The checkpoint to continue from (run.json's ``resume`` and one exists), else None."""
        key = self.run["key"]
        if not self.run["resume"] or not self.store.checkpoint_path(key).exists():
            return None
        state = self.store.load_checkpoint(key, self.config.device)
        self.algorithm.load_state_dict(state["algorithm"])
        return state

    def record(
        self, history: list[dict], status: str, extra: dict[str, Any], wall_seconds: float
    ) -> dict[str, Any]:
        """The simulator's record plus the engine, its nodes and any failures."""
        return federated_record(
            key=self.run["key"],
            status=status,
            config=self.config,
            algo_options=self.algorithm.opts,
            feature_dim=self.run["feature_dim"],
            dataset=self.run["dataset"],
            partition=self.run["partition"],
            history=history,
            wall_seconds=wall_seconds,
            environment={"flwr": _flwr_version()},
            server=self.algorithm.record_extras(),
            extra={"engine": self.run["engine"]} | extra,
        )

    def save_incomplete(self, record: dict[str, Any]) -> Path:
        path = self.incomplete_path()
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(path, json.dumps(record, indent=1, default=json_default).encode())
        return path

    def artifacts(self) -> dict[str, np.ndarray]:
        try:
            items = self.algorithm.artifacts().items()
        except Exception as exc:  # noqa: BLE001 - some artefacts need client data
            log.warning("artefacts skipped: the server holds no client data (%s)", exc)
            return {}
        return {k: v.detach().cpu().float().numpy() for k, v in items}


def _flwr_version() -> str | None:
    try:
        import flwr

        return flwr.__version__
    except ImportError:  # pragma: no cover - the adapter is only used with flwr
        return None


# ---- a node -------------------------------------------------------------------------------
@dataclass
class NodeRuntime:
    """One client on one node: data from its node file, model and state from the server."""

    config: RunConfig
    client: Client
    algorithm: Algorithm
    global_test: tuple[torch.Tensor, torch.Tensor] | None

    @classmethod
    def build(cls, run: dict[str, Any], index: int, data_file: str | Path, blob: bytes) -> Any:

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
        classes = run["dataset"]["classes"]
        model = _build_model(run, cfg, index)
        client = make_client(cfg, index, model, (train_x, train_y), (test_x, test_y), len(classes))
        options = resolve_options(cfg.algorithm, cfg.algo_options)
        algorithm = get_algorithm(cfg.algorithm)(
            options, run_context(cfg, classes, run["feature_dim"], run["groups"])
        )
        node = cls(cfg, client, algorithm, global_test)
        node.load_blob(blob)
        return node

    def load_blob(self, blob: bytes) -> None:
        saved = from_bytes(blob, self.config.device)
        client = self.client
        client.model.load_state_dict(saved["model"])
        client.state = saved["state"]
        client.model_seconds = saved["model_seconds"]
        client.optimizer = torch.optim.SGD(
            self.algorithm.client_parameters(client), lr=self.config.lr
        )
        if saved["optimizer"] is not None:
            client.optimizer.load_state_dict(saved["optimizer"])

    def blob(self) -> bytes:
        return _client_blob(self.client)

    def round(self, work: RoundWork, message: Message | None) -> ClientReply:
        """receive -> evaluate -> (train -> upload): this client's half of one round."""
        cfg, client, algo = self.config, self.client, self.algorithm
        model_before = client.model_seconds
        received = 0.0 if message is None else receive_client(algo, client, message)
        seed_everything(derive_seed(cfg.seed, work.round))  # as the server, every round
        client.round = work.round
        reply = evaluate_client(algo, client, work, self.global_test)
        reply.timings["broadcast"] = received
        if work.train:
            start = time.perf_counter()
            reply.train_loss = train_client(algo, client, cfg, work.round)
            reply.timings["train"] = time.perf_counter() - start
            upload_client(algo, client, reply)
        reply.timings["model"] = client.model_seconds - model_before
        return reply

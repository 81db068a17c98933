"""Engine-independent pieces of the Flower adapter: the work folder, the server loop, the node.

A Flower run is split the way a real federation is:

* the *work folder* (written by :func:`prepare_workdir` from a config and a dataset) holds
  ``run.json`` (config, dataset facts, the run's key), ``server.npz`` (the set-up RNG state
  of ``engine.build.initial_models``; nothing of any client) and one ``node-<i>.npz`` per
  client with that client's train/test images and starting model, built as the simulator
  builds it: what is handed to each node;
* the server (:class:`ServerLoop`, run inside Flower's ServerApp) owns the method's server
  half and its state (e.g. FedTSP's text encoder and prompts); it sets up from the facts and
  set-up uploads the nodes send in a ``query.setup`` exchange, and the rounds are the
  engine's :class:`fedtsp.engine.loop.RoundLoop`, the simulator's;
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedtsp.algorithms import Message, get_algorithm, resolve_options
from fedtsp.algorithms.base import ClientHalf, ServerHalf
from fedtsp.algorithms.clients import Client, ClientFacts
from fedtsp.core.atomic import atomic_write_bytes
from fedtsp.core.config import ConfigError, RunConfig
from fedtsp.core.results import RunStore, json_default
from fedtsp.core.seeding import derive_seed, seed_everything
from fedtsp.data import ImageDataset, device_images
from fedtsp.engine.build import (
    Datasets,
    client_data,
    client_model,
    data_identity,
    initial_models,
    load_datasets,
    make_client,
    resolve_feature_dim,
    run_context,
)
from fedtsp.engine.client_round import (
    ClientReply,
    RoundWork,
    SetupReply,
    evaluate_client,
    receive_client,
    set_up_client,
    train_client,
    upload_client,
)
from fedtsp.engine.loop import checkpoint_due, round_work, set_up_server, setup_bytes
from fedtsp.engine.record import federated_record
from fedtsp.engine.runspec import check_run, run_key

log = logging.getLogger("fedtsp.engine.flower")

ENGINES = ("flower-sim", "flower-processes")
FAILURE_POLICIES = ("stop", "continue")
INITIAL = "initial."  # node file entries of the client's starting model
SETUP_RNG = "setup_rng"  # the set-up RNG state (torch.save bytes as uint8)


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
    """Write run.json, server.npz and node-<i>.npz (data and starting model); return
    run.json's content.

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
    server: ServerHalf = field(init=False)
    setup_replies: dict[int, SetupReply] = field(init=False, default_factory=dict)
    setup_traffic: dict[str, float] | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        self.workdir = Path(self.workdir)
        self.run = load_run(self.workdir)
        self.config = RunConfig.from_dict(self.run["config"])
        cfg, meta = self.config, self.run["dataset"]
        options = resolve_options(cfg.algorithm, cfg.algo_options)
        context = run_context(cfg, meta["classes"], self.run["feature_dim"], self.run["groups"])
        self.server = get_algorithm(cfg.algorithm).Server(options, context)

    def set_up(self, replies: dict[int, SetupReply]) -> Message | None:
        """The server half's set-up from the nodes' set-up replies; returns its first message."""
        with np.load(self.workdir / "server.npz") as arrays:
            rng = from_bytes(arrays[SETUP_RNG].tobytes())
        self.setup_replies = dict(replies)
        first = set_up_server(self.server, replies, rng)
        self.setup_traffic = setup_bytes(replies, first)
        return first

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
            # The set-up's inputs: a resumed server sets up again from them, then loads.
            "setup": {i: (r.facts.to_json(), r.upload) for i, r in self.setup_replies.items()},
            "algorithm": self.server.state_dict(),
            "pending": pending,
            "history": history,
        }
        self.store.save_checkpoint(self.run["key"], state)

    def resume_state(self) -> dict[str, Any] | None:
        """The checkpoint to continue from (run.json's ``resume`` and one exists), set up and
        loaded into the server half; else None."""
        key = self.run["key"]
        if not self.run["resume"] or not self.store.checkpoint_path(key).exists():
            return None
        state = self.store.load_checkpoint(key, self.config.device)
        replies = {
            i: SetupReply(ClientFacts.from_json(facts), upload)
            for i, (facts, upload) in state["setup"].items()
        }
        self.set_up(replies)
        self.server.load_state_dict(state["algorithm"])
        return state

    def record(
        self, history: list[dict], status: str, extra: dict[str, Any], wall_seconds: float
    ) -> dict[str, Any]:
        """The simulator's record plus the engine, its nodes and any failures."""
        return federated_record(
            key=self.run["key"],
            status=status,
            config=self.config,
            algo_options=self.server.opts,
            feature_dim=self.run["feature_dim"],
            dataset=self.run["dataset"],
            partition=self.run["partition"],
            history=history,
            wall_seconds=wall_seconds,
            environment={"flwr": _flwr_version()},
            server=self.server.record_extras(),
            setup=self.setup_traffic,
            extra={"engine": self.run["engine"]} | extra,
        )

    def save_incomplete(self, record: dict[str, Any]) -> Path:
        path = self.incomplete_path()
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(path, json.dumps(record, indent=1, default=json_default).encode())
        return path

    def artifacts(self) -> dict[str, np.ndarray]:
        """The server half's artefacts (``analysis_artifacts`` need every client: simulator
        only)."""
        return {k: v.detach().cpu().float().numpy() for k, v in self.server.artifacts().items()}


def _flwr_version() -> str | None:
    try:
        import flwr

        return flwr.__version__
    except ImportError:  # pragma: no cover - the adapter is only used with flwr
        return None


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
        options = resolve_options(cfg.algorithm, cfg.algo_options)
        half = get_algorithm(cfg.algorithm).Client(
            options, run_context(cfg, classes, run["feature_dim"], run["groups"])
        )
        node = cls(cfg, client, half, global_test)
        if blob is None:
            node.setup_reply = set_up_client(half, client, cfg, rng)
        else:
            node.load_blob(blob)
        return node

    def load_blob(self, blob: bytes) -> None:
        saved = from_bytes(blob, self.config.device)
        client = self.client
        client.model.load_state_dict(saved["model"])
        client.state = saved["state"]
        client.model_seconds = saved["model_seconds"]
        client.optimizer = torch.optim.SGD(self.half.client_parameters(client), lr=self.config.lr)
        if saved["optimizer"] is not None:
            client.optimizer.load_state_dict(saved["optimizer"])

    def blob(self) -> bytes:
        """The client's persistent state: model weights, optimiser state, method state."""
        client = self.client
        return to_bytes(
            {
                "model": client.model.state_dict(),
                "optimizer": client.optimizer.state_dict() if client.optimizer else None,
                "state": client.state,  # modules (shared models, generators) pickled whole
                "model_seconds": client.model_seconds,
            }
        )

    def round(self, work: RoundWork, message: Message | None) -> ClientReply:
        """receive -> evaluate -> (train -> upload): this client's half of one round."""
        cfg, client, algo = self.config, self.client, self.half
        model_before = client.model_seconds
        received = 0.0 if message is None else receive_client(algo, client, message)
        seed_everything(derive_seed(cfg.seed, work.round))  # as the server, every round
        client.round = work.round
        reply = evaluate_client(algo, client, work, self.global_test)
        reply.timings["broadcast"] = received
        if work.train:
            train_client(algo, client, cfg, reply)
            upload_client(algo, client, reply)
        reply.timings["model"] = client.model_seconds - model_before
        return reply

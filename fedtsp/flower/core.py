"""Engine-independent pieces of the Flower adapter: the work folder, the server loop, the node.

A Flower run is split the way a real federation is:

* the *work folder* (written by :func:`prepare_workdir` from a config and a dataset) holds
  ``run.json`` (config, dataset facts, the run's key), ``server.npz`` (each client's label
  vector, which some methods' set-up reads; never images) and one ``node-<i>.npz`` per
  client with that client's train/test images: the partition handed to each node;
* the server (:class:`ServerLoop`, run inside Flower's ServerApp) owns the algorithm object
  and its state (e.g. FedTSP's text encoder and prompts), builds every client's initial
  model exactly as the in-process simulator does, ships it to its node once, then drives
  the rounds: evaluate -> train -> upload on the nodes, server step on the server;
* a node (:class:`NodeRuntime`, run inside Flower's ClientApp) holds one client: its data,
  model, optimiser and algorithm state, kept in the node's Flower ``Context.state`` between
  rounds (and cached in memory while the same process serves the node).

Seeding follows :func:`fedtsp.simulation.run_experiment`: the global RNG is reseeded with
``derive_seed(seed, t)`` at the start of round t (on the server and on every node) and each
client's batch order comes from ``derive_seed(seed, t, i)``, so per-round accuracies equal
the simulator's whenever local training draws nothing from the global RNG (no dropout).
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

from fedtsp.algorithms import Algorithm, Message, RunContext, get_algorithm, resolve_options
from fedtsp.atomic import atomic_write_bytes
from fedtsp.clients import Client
from fedtsp.config import ConfigError, RunConfig
from fedtsp.data import ImageDataset, device_images
from fedtsp.models.families import build_client_model
from fedtsp.paths import portable_path
from fedtsp.results import RECORD_VERSION, RunStore, code_version, json_default, summarize_history
from fedtsp.runspec import check_run, run_key
from fedtsp.seeding import derive_seed, seed_everything
from fedtsp.simulation import (
    PHASES,
    autocast_factory,
    client_batching,
    global_test_indices,
    message_nbytes,
    partition_dataset,
    resolve_feature_dim,
    seed_client_model,
)

log = logging.getLogger("fedtsp.flower")

ENGINES = ("flower-sim", "flower-processes")
FAILURE_POLICIES = ("stop", "continue")
# FedKD's client hooks read server-side attributes (the update shapes set up on the server,
# the round counter advanced by its server step), which a node's copy of the algorithm
# does not have; every other method's client side reads only its options and client.state.
UNSUPPORTED = {"fedkd": "its client hooks read server-side state (update shapes, round)"}


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
def engine_key(config: RunConfig, dataset_checksum: str, engine: str) -> str:
    """The run's key: the simulator's key material plus the engine, for provenance."""
    return run_key(config, {"dataset_checksum": dataset_checksum, "engine": engine})


def check_supported(config: RunConfig) -> None:
    if config.algorithm in UNSUPPORTED:
        raise ConfigError(
            f"algorithm={config.algorithm!r} cannot run on Flower yet: "
            f"{UNSUPPORTED[config.algorithm]}; use --engine simulator"
        )


def prepare_workdir(
    config: RunConfig,
    dataset: ImageDataset,
    workdir: str | Path,
    *,
    out: str | Path,
    engine: str,
    on_failure: str = "stop",
    round_timeout: float = 3600.0,
) -> dict[str, Any]:
    """Write run.json, server.npz and node-<i>.npz; return run.json's content."""

    if engine not in ENGINES:
        raise ConfigError(f"engine={engine!r} is invalid; choose one of {', '.join(ENGINES)}")
    if on_failure not in FAILURE_POLICIES:
        raise ConfigError(
            f"on_failure={on_failure!r} is invalid; choose one of {', '.join(FAILURE_POLICIES)}"
        )
    if not round_timeout > 0:
        raise ConfigError(f"round_timeout={round_timeout} is invalid; must be > 0 seconds")
    check_run(config)
    check_supported(config)
    if getattr(config, "setting", "htfl") == "gfl":
        raise ConfigError(
            "setting='gfl' cannot run on Flower yet (its global-model evaluation is "
            "simulator-only); use --engine simulator"
        )
    algorithm_cls = get_algorithm(config.algorithm)
    options = resolve_options(config.algorithm, config.algo_options)
    feature_dim = resolve_feature_dim(config, algorithm_cls, options)
    workdir = Path(workdir).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    images, labels, partition = partition_dataset(config, dataset)

    due_global = config.global_eval_every > 0
    for i in range(config.num_clients):
        tr, te = partition.client_train[i], partition.client_test[i]
        arrays = {
            "train_x": images[tr],
            "train_y": labels[tr],
            "test_x": images[te],
            "test_y": labels[te],
        }
        if due_global:
            idx = global_test_indices(config, dataset)
            arrays |= {"global_x": dataset.test_images[idx], "global_y": dataset.test_labels[idx]}
        _save_npz(workdir / f"node-{i}.npz", arrays)
    _save_npz(
        workdir / "server.npz",
        {f"train_y_{i}": labels[idx] for i, idx in enumerate(partition.client_train)},
    )
    run = {
        "key": engine_key(config, dataset.checksum, engine),
        "engine": engine,
        "config": config.to_dict(),
        "feature_dim": feature_dim,
        "dataset": {
            "name": dataset.name,
            "source": portable_path(dataset.source),
            "checksum": dataset.checksum,
            "classes": list(dataset.classes),
            "channels": dataset.channels,
            "image_size": dataset.image_size,
        },
        "partition": partition.stats(),
        "out": str(Path(out).resolve()),
        "on_failure": on_failure,
        "round_timeout": float(round_timeout),
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


def _run_context(run: dict[str, Any], config: RunConfig) -> RunContext:
    ctx = RunContext(
        dataset=config.dataset,
        class_names=list(run["dataset"]["classes"]),
        feature_dim=run["feature_dim"],
        num_clients=config.num_clients,
        rounds=config.rounds,
        device=torch.device(config.device),
        seed=config.seed,
    )
    if hasattr(config, "setting") and hasattr(ctx, "setting"):
        ctx.setting = config.setting
    return ctx


def _build_model(run: dict[str, Any], config: RunConfig, index: int) -> torch.nn.Module:
    meta = run["dataset"]
    return build_client_model(
        config.family,
        index,
        len(meta["classes"]),
        feature_dim=run["feature_dim"],
        in_channels=meta["channels"],
        image_size=meta["image_size"],
    ).to(config.device)


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
            seed_client_model(cfg)
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
        self.algorithm = get_algorithm(cfg.algorithm)(options, _run_context(self.run, cfg))
        self.first_broadcast = self.algorithm.setup(clients)
        self.initial_blobs = [_client_blob(c) for c in clients]

    @property
    def store(self) -> RunStore:
        return RunStore(self.run["out"])

    def incomplete_path(self) -> Path:
        return Path(self.run["out"]) / "incomplete" / f"{self.run['key']}.json"

    # The record has the simulator's layout plus the engine, nodes and failures.
    def record(self, history: list[dict], status: str, extra: dict[str, Any]) -> dict[str, Any]:
        cfg = self.config
        return {
            "record_version": RECORD_VERSION,
            "key": self.run["key"],
            "status": status,
            "engine": self.run["engine"],
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "config": cfg.to_dict(),
            "algo_options": vars(self.algorithm.opts).copy(),
            "seed": cfg.seed,
            "feature_dim": self.run["feature_dim"],
            **code_version(),
            "environment": {
                "torch": torch.__version__,
                "flwr": _flwr_version(),
                "device": str(cfg.device),
                "threads": torch.get_num_threads(),
            },
            "dataset": {k: self.run["dataset"][k] for k in ("name", "source", "checksum")}
            | {"classes": self.run["dataset"]["classes"]},
            "partition": self.run["partition"],
            "history": history,
            "summary": summarize_history(history) if history else {},
            **extra,
            "cache_hit": False,
        }

    def save_incomplete(self, record: dict[str, Any]) -> Path:
        path = self.incomplete_path()
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(path, json.dumps(record, indent=1, default=json_default).encode())
        return path

    def round_row(
        self, t: int, replies: dict[int, dict[str, Any]], uploads: dict[int, Message]
    ) -> tuple[dict[str, Any], Message | None]:
        """One history row from the nodes' replies (client order), plus the server step.

        Mirrors fedtsp.simulation._evaluate_round / _train_round so rows are comparable.
        """

        order = sorted(replies)
        evals = [replies[i]["eval"] for i in order]
        total = sum(e["total"] for e in evals)
        row: dict[str, Any] = {
            "round": t,
            "acc": sum(e["correct"] for e in evals) / total,
            "top5": sum(e["correct_top5"] for e in evals) / total,
            "test_loss": sum(e["loss_sum"] for e in evals) / total,
            "client_acc": [round(e["correct"] / max(e["total"], 1), 6) for e in evals],
        }
        globals_ = [replies[i]["global_acc"] for i in order if "global_acc" in replies[i]]
        if globals_:
            row["global_acc"] = float(np.mean(globals_))
        timings = dict.fromkeys(PHASES, 0.0) | {"model": 0.0}
        for i in order:
            for name, seconds in replies[i]["timings"].items():
                timings[name] = timings.get(name, 0.0) + seconds
        broadcast = None
        if t < self.config.rounds:
            ups = [uploads[i] for i in order]  # client order: float sums match the simulator
            start = time.perf_counter()
            broadcast = self.algorithm.server_step(ups, t)
            timings["server"] = time.perf_counter() - start
            row |= {
                "train_loss": float(np.nanmean([replies[i]["train_loss"] for i in order])),
                "bytes_up_per_client": float(np.mean([message_nbytes(u) for u in ups])),
                "bytes_down_per_client": float(message_nbytes(broadcast)),
                **self.algorithm.round_metrics(),
            }
        row["timings"] = timings
        return row, broadcast

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
        model = _build_model(run, cfg, index)
        client = Client(
            index,
            model,
            train_x,
            train_y,
            test_x,
            test_y,
            len(run["dataset"]["classes"]),
            autocast=autocast_factory(cfg),
            **client_batching(cfg),
        )
        options = resolve_options(cfg.algorithm, cfg.algo_options)
        algorithm = get_algorithm(cfg.algorithm)(options, _run_context(run, cfg))
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

    def round(
        self, t: int, broadcast: Message | None, train: bool, global_eval: bool
    ) -> tuple[dict[str, Any], Message]:
        """receive -> evaluate -> (train -> upload), as one simulator round on this client."""
        from fedtsp.clients import NonFiniteLossError

        cfg, client, algo = self.config, self.client, self.algorithm
        timings: dict[str, float] = {}
        model_before = client.model_seconds
        start = time.perf_counter()
        if broadcast is not None:
            algo.receive(client, broadcast)
        timings["broadcast"] = time.perf_counter() - start
        seed_everything(derive_seed(cfg.seed, t))
        start = time.perf_counter()
        prepare = getattr(algo, "prepare_evaluation", None)
        if prepare is not None:  # e.g. "-FT" methods fine-tune a head copy first
            prepare(client, t)
        result = client.evaluate(algo.predict, client.test_x, client.test_y)
        reply: dict[str, Any] = {
            "eval": {
                "correct": result.correct,
                "correct_top5": result.correct_top5,
                "total": result.total,
                "loss_sum": result.loss_sum,
            }
        }
        if global_eval and self.global_test is not None:
            gx, gy = self.global_test
            reply["global_acc"] = client.evaluate(algo.predict, gx, gy).accuracy
        timings["evaluate"] = time.perf_counter() - start
        upload: Message = {}
        if train:
            generator = torch.Generator().manual_seed(derive_seed(cfg.seed, t, client.index))
            start = time.perf_counter()
            try:
                reply["train_loss"] = client.train(
                    algo.train_loss, cfg.local_epochs, cfg.batch_size, generator, algo.before_step
                )
            except NonFiniteLossError as exc:
                raise NonFiniteLossError(f"{exc} in round {t}; the run stops here") from None
            timings["train"] = time.perf_counter() - start
            start = time.perf_counter()
            upload = algo.upload(client)
            timings["upload"] = time.perf_counter() - start
        timings["model"] = client.model_seconds - model_before
        reply["timings"] = timings
        return reply, upload

"""The in-process federated simulator: every client's data and model live in memory.

One round = evaluate every client (before training, as in the authors' protocol) ->
local training -> upload -> server step -> broadcast. A checkpoint is written after every
round; the random state of round t is derived from (seed, t) alone, so a resumed run
continues exactly as an uninterrupted one would.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import resource
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from fedtsp import runspec
from fedtsp.algorithms import Algorithm, Message, RunContext, get_algorithm, resolve_options
from fedtsp.clients import Client, NonFiniteLossError
from fedtsp.config import ConfigError, RunConfig
from fedtsp.data import (
    ImageDataset,
    Partition,
    device_images,
    load_dataset,
    make_partition,
    stratified_subsample,
)
from fedtsp.models.families import build_client_model
from fedtsp.paths import portable_path
from fedtsp.results import (
    RECORD_VERSION,
    RunStore,
    RunStoreError,
    atomic_save,
    code_version,
    summarize_history,
)
from fedtsp.runspec import check_run
from fedtsp.seeding import derive_seed, seed_everything

log = logging.getLogger("fedtsp")

DEFAULT_FEATURE_DIM = 512
PHASES = ("evaluate", "train", "upload", "server", "broadcast", "checkpoint")


def seed_client_model(config: RunConfig) -> None:
    """Call before building each client's model: under ``client_init="shared"`` torch is
    reseeded with the run's seed, so every client of one architecture starts identical."""
    if config.client_init == "shared":
        torch.manual_seed(config.seed)


def client_batching(config: RunConfig) -> dict[str, bool]:
    """The `Client` fields that follow RunConfig.batch_order and undersized_clients."""
    return {
        "shuffle": config.batch_order == "shuffled",
        "train_undersized": config.undersized_clients == "train",
    }


def message_nbytes(message: Message) -> int:
    return sum(t.numel() * t.element_size() for t in message.values() if torch.is_tensor(t))


@dataclass
class PreparedRun:
    """Everything built before round 0; exposed so tests and notebooks can inspect it."""

    config: RunConfig
    key: str
    dataset: ImageDataset
    partition: Partition
    clients: list[Client]
    algorithm: Algorithm
    first_broadcast: Message | None
    global_test: tuple[torch.Tensor, torch.Tensor] | None


def resolve_feature_dim(config: RunConfig, algorithm_cls: type[Algorithm], options: Any) -> int:
    required = algorithm_cls.required_feature_dim(options)
    if config.feature_dim is not None and required is not None and config.feature_dim != required:
        raise ConfigError(
            f"feature_dim={config.feature_dim} is invalid for {config.algorithm}: its text "
            f"encoder has width {required}; leave feature_dim unset or set it to {required}"
        )
    return config.feature_dim or required or DEFAULT_FEATURE_DIM


def run_key(config: RunConfig, dataset: ImageDataset) -> str:
    """The run's identity: its full config plus the exact data it trains on."""
    return runspec.run_key(config, {"dataset_checksum": dataset.checksum})


def partition_dataset(
    config: RunConfig, dataset: ImageDataset
) -> tuple[np.ndarray, np.ndarray, Partition]:
    """Merge the official splits and draw the config's Dirichlet partition over them."""
    images = np.concatenate([dataset.train_images, dataset.test_images])
    labels = np.concatenate([dataset.train_labels, dataset.test_labels])
    partition = make_partition(
        labels,
        dataset.num_classes,
        config.num_clients,
        config.alpha,
        batch_size=config.batch_size,
        train_ratio=config.train_ratio,
        seed=config.partition_seed,
        fraction=config.fraction,
        min_size=config.min_client_samples,
    )
    return images, labels, partition


def prepare(
    config: RunConfig, data: str | Path | None = None, dataset: ImageDataset | None = None
) -> PreparedRun:
    check_run(config)
    algorithm_cls = get_algorithm(config.algorithm)
    options = resolve_options(config.algorithm, config.algo_options)
    feature_dim = resolve_feature_dim(config, algorithm_cls, options)
    if dataset is None:
        dataset = load_dataset(config.dataset, data)
    key = run_key(config, dataset)
    device = torch.device(config.device)

    images, labels, partition = partition_dataset(config, dataset)

    seed_everything(config.seed)
    autocast = autocast_factory(config)

    def tensors(idx: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        x = device_images(images[idx], device, config.channels_last)
        return x, torch.from_numpy(labels[idx]).long().to(device)

    clients = []
    for i in range(config.num_clients):
        seed_client_model(config)
        model = build_client_model(
            config.family,
            i,
            dataset.num_classes,
            feature_dim=feature_dim,
            in_channels=dataset.channels,
            image_size=dataset.image_size,
        ).to(device)
        train_x, train_y = tensors(partition.client_train[i])
        test_x, test_y = tensors(partition.client_test[i])
        clients.append(
            Client(
                i,
                model,
                train_x,
                train_y,
                test_x,
                test_y,
                dataset.num_classes,
                autocast=autocast,
                **client_batching(config),
            )
        )

    ctx = RunContext(
        dataset=config.dataset,
        class_names=list(dataset.classes),
        feature_dim=feature_dim,
        num_clients=config.num_clients,
        rounds=config.rounds,
        device=device,
        seed=config.seed,
        setting=config.setting,
    )
    algorithm = algorithm_cls(options, ctx)
    first = algorithm.setup(clients)
    for client in clients:
        client.optimizer = torch.optim.SGD(algorithm.client_parameters(client), lr=config.lr)
    global_test = None
    if config.global_eval_every > 0 or config.setting == "gfl":
        idx = global_test_indices(config, dataset)
        global_test = (
            device_images(dataset.test_images[idx], device, config.channels_last),
            torch.from_numpy(dataset.test_labels[idx]).long().to(device),
        )
    return PreparedRun(config, key, dataset, partition, clients, algorithm, first, global_test)


def autocast_factory(config: RunConfig) -> Any:
    if config.precision == "fp32":
        return contextlib.nullcontext
    device_type = torch.device(config.device).type
    return functools.partial(torch.autocast, device_type=device_type, dtype=torch.bfloat16)


def _peak_memory_mb(device: torch.device) -> dict[str, float]:
    # ru_maxrss is in KiB on Linux.
    out = {"host_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
    if device.type == "cuda":
        out["device_mb"] = torch.cuda.max_memory_allocated(device) / 2**20
    return out


def global_test_indices(config: RunConfig, dataset: ImageDataset) -> np.ndarray:
    """The global test set: the official (class-balanced) test split; with a data fraction
    < 1 the same stratified fraction of it, which keeps it balanced and its cost in step."""
    return stratified_subsample(dataset.test_labels, config.fraction, config.partition_seed)


def global_eval_due(config: RunConfig, round_index: int) -> bool:
    """Whether round `round_index` also scores every client on the global test set: every
    `global_eval_every` rounds after training started, and after the last round."""
    k = config.global_eval_every
    return k > 0 and ((round_index > 0 and round_index % k == 0) or round_index == config.rounds)


def _evaluate_round(run: PreparedRun, round_index: int) -> dict[str, Any]:
    algo, clients, cfg = run.algorithm, run.clients, run.config
    results = []
    for c in clients:
        algo.prepare_evaluation(c, round_index)
        results.append(c.evaluate(algo.predict, c.test_x, c.test_y))
    total = sum(r.total for r in results)
    row: dict[str, Any] = {
        "round": round_index,
        "acc": sum(r.correct for r in results) / total,
        "top5": sum(r.correct_top5 for r in results) / total,
        "test_loss": sum(r.loss_sum for r in results) / total,
        "client_acc": [round(r.accuracy, 6) for r in results],
    }
    if global_eval_due(cfg, round_index) and run.global_test is not None:
        gx, gy = run.global_test
        accs = [c.evaluate(algo.predict, gx, gy).accuracy for c in clients]
        row["global_acc"] = float(np.mean(accs))
    if cfg.setting == "gfl" and run.global_test is not None:
        # After every broadcast each client holds the global model; client 0's copy is it.
        result = clients[0].evaluate(algo.predict, *run.global_test)
        row["gfl_acc"] = result.accuracy
        row["gfl_top5"] = result.correct_top5 / max(result.total, 1)
    return row


def setting_summary(history: list[dict[str, Any]], setting: str) -> dict[str, Any]:
    """The Table 3 number of a homogeneous run, under a name that says what it is.

    gfl: the global model's accuracy on the balanced official test set (best round and the
    mean of the last 5); pfl: the sample-weighted accuracy of the personalised models on the
    clients' own test splits (for "-FT" methods after fine-tuning the head), i.e. ``acc``.
    """
    key = {"gfl": "gfl_acc", "pfl": "acc"}.get(setting)
    if key is None:
        return {}
    values = [row[key] for row in history if row.get(key) is not None]
    if not values:
        return {}
    best = int(np.argmax(values))
    return {
        f"best_{setting}_acc": values[best],
        f"best_{setting}_round": [r for r in history if r.get(key) is not None][best]["round"],
        f"last5_mean_{setting}_acc": float(np.mean(values[-5:])),
    }


def _train_round(run: PreparedRun, round_index: int, timings: dict[str, float]) -> dict[str, Any]:
    algo, clients, cfg = run.algorithm, run.clients, run.config
    start = time.perf_counter()
    losses = []
    for client in clients:
        generator = torch.Generator().manual_seed(derive_seed(cfg.seed, round_index, client.index))
        try:
            losses.append(
                client.train(
                    algo.train_loss, cfg.local_epochs, cfg.batch_size, generator, algo.before_step
                )
            )
        except NonFiniteLossError as exc:
            raise NonFiniteLossError(f"{exc} in round {round_index}; the run stops here") from None
    timings["train"] = time.perf_counter() - start

    start = time.perf_counter()
    uploads = [algo.upload(client) for client in clients]
    timings["upload"] = time.perf_counter() - start

    start = time.perf_counter()
    broadcast = algo.server_step(uploads, round_index)
    timings["server"] = time.perf_counter() - start

    start = time.perf_counter()
    for client in clients:
        algo.receive(client, broadcast)
    timings["broadcast"] = time.perf_counter() - start
    return {
        "train_loss": float(np.nanmean(losses)),  # NaN: a client with no batch
        "bytes_up_per_client": float(np.mean([message_nbytes(u) for u in uploads])),
        "bytes_down_per_client": float(message_nbytes(broadcast)),
        **algo.round_metrics(),
    }


def _save_checkpoint(path: Path, run: PreparedRun, round_index: int, history: list) -> None:
    state = {
        "key": run.key,
        "round": round_index,
        "clients": [c.state_dict() for c in run.clients],
        "algorithm": run.algorithm.state_dict(),
        "history": history,
    }
    atomic_save(path, lambda handle: torch.save(state, handle))


def _load_checkpoint(path: Path, run: PreparedRun) -> tuple[int, list]:
    try:
        state = torch.load(path, map_location=run.config.device, weights_only=False)
    except Exception as exc:  # torch reports a damaged file in many ways
        raise RunStoreError(
            f"checkpoint {path} is unreadable ({type(exc).__name__}); move it away to restart "
            "the run from round 0"
        ) from exc
    if not isinstance(state, dict) or state.get("key") != run.key:
        other = state.get("key") if isinstance(state, dict) else None
        raise RunStoreError(
            f"checkpoint {path} belongs to run {other}, not to run {run.key}; "
            "remove it or rerun without --resume"
        )
    for client, saved in zip(run.clients, state["clients"], strict=True):
        client.load_state_dict(saved)
    run.algorithm.load_state_dict(state["algorithm"])
    return state["round"], state["history"]


def run_experiment(
    config: RunConfig,
    *,
    data: str | Path | None = None,
    out: str | Path = "runs",
    resume: bool = False,
    force: bool = False,
    progress: bool = True,
    dataset: ImageDataset | None = None,
    stop_after: int | None = None,
    checkpoint_every: int = 1,
) -> dict[str, Any]:
    """Run (or fetch from the store) one federated experiment and return its record.

    A checkpoint is written every ``checkpoint_every`` rounds (large families on fast
    devices may prefer fewer writes); a resumed run repeats at most that many rounds and
    still ends identical, because each round's randomness depends only on (seed, round).

    ``stop_after`` ends the process-equivalent of an interruption after that many rounds
    (the checkpoint stays; used by tests and for chunked runs).
    """
    wall_start = time.perf_counter()
    if checkpoint_every < 1:
        raise ConfigError(f"checkpoint_every={checkpoint_every} is invalid; must be >= 1")
    check_run(config)
    if dataset is None:
        dataset = load_dataset(config.dataset, data)
    store = RunStore(out)
    cached = store.load(run_key(config, dataset))
    if cached is not None and not force:
        log.info("run %s found in %s; reusing it (force=True reruns)", cached["key"], out)
        cached["cache_hit"] = True
        return cached
    run = prepare(config, dataset=dataset)
    ckpt_path = store.checkpoint_path(run.key)
    history: list[dict[str, Any]] = []
    start_round = 0
    if ckpt_path.exists() and not force:
        if not resume:
            raise FileExistsError(
                f"an interrupted run of this config exists ({ckpt_path}); "
                "pass resume=True (--resume) to continue it or force=True (--force) to restart"
            )
        done, history = _load_checkpoint(ckpt_path, run)
        start_round = done + 1
        log.info("resuming run %s after round %d", run.key, done)
    elif run.first_broadcast is not None:
        for client in run.clients:
            run.algorithm.receive(client, run.first_broadcast)

    cfg = run.config
    totals = dict.fromkeys(PHASES, 0.0) | {"model": 0.0}
    for row in history:
        for name, seconds in row["timings"].items():
            totals[name] = totals.get(name, 0.0) + seconds
    bar = tqdm(
        total=cfg.rounds + 1,
        initial=start_round,
        disable=not progress,
        desc=f"{cfg.algorithm} {cfg.dataset}",
        unit="round",
    )
    for t in range(start_round, cfg.rounds + 1):
        round_start = time.perf_counter()
        seed_everything(derive_seed(cfg.seed, t))
        model_before = sum(c.model_seconds for c in run.clients)
        timings = dict.fromkeys(PHASES, 0.0)
        start = time.perf_counter()
        row = _evaluate_round(run, t)
        timings["evaluate"] = time.perf_counter() - start
        if t < cfg.rounds:  # the last evaluation closes the run; no training after it
            row.update(_train_round(run, t, timings))
        timings["model"] = sum(c.model_seconds for c in run.clients) - model_before
        row["wall"] = time.perf_counter() - round_start
        row["timings"] = timings
        history.append(row)
        if t < cfg.rounds and ((t + 1) % checkpoint_every == 0 or stop_after == t + 1):
            start = time.perf_counter()
            _save_checkpoint(ckpt_path, run, t, history)
            timings["checkpoint"] = time.perf_counter() - start
        for name, seconds in timings.items():
            totals[name] += seconds
        best = max(r["acc"] for r in history)
        bar.set_postfix(acc=f"{row['acc']:.4f}", best=f"{best:.4f}")
        bar.update(1)
        if stop_after is not None and t + 1 >= stop_after and t < cfg.rounds:
            bar.close()
            return {"key": run.key, "interrupted_after_round": t, "history": history}
    bar.close()

    record = {
        "record_version": RECORD_VERSION,
        "key": run.key,
        "status": "complete",
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "config": cfg.to_dict(),
        "algo_options": vars(run.algorithm.opts).copy(),
        "seed": cfg.seed,
        "feature_dim": run.algorithm.ctx.feature_dim,
        **code_version(),
        "environment": {
            "torch": torch.__version__,
            "device": str(cfg.device),
            "threads": torch.get_num_threads(),
        },
        "dataset": {
            "name": run.dataset.name,
            "source": portable_path(run.dataset.source),
            "checksum": run.dataset.checksum,
            "classes": list(run.dataset.classes),
        },
        "partition": run.partition.stats(),
        "history": history,
        "summary": summarize_history(history) | setting_summary(history, cfg.setting),
        # "wall": this process; "rounds_wall": all rounds, including those before a resume.
        "timings": totals
        | {
            "wall": time.perf_counter() - wall_start,
            "rounds_wall": sum(row["wall"] for row in history),
        },
        "peak_memory": _peak_memory_mb(torch.device(cfg.device)),
        "cache_hit": False,
    }
    artifacts = {k: v.detach().cpu().float().numpy() for k, v in run.algorithm.artifacts().items()}
    store.save(record, artifacts)
    ckpt_path.unlink(missing_ok=True)
    return record

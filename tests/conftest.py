"""Shared fixtures: a tiny learnable synthetic dataset, paths to the offline data, and helpers
that drive a method's two halves through the engine and record what crossed it."""

from __future__ import annotations

# First: `import fedtsp` pins the CPU kernels (fedtsp.core.isa) before torch and NumPy load,
# so the tests run the kernels the records and the golden histories were made with.
import fedtsp  # noqa: F401

# isort: split
import hashlib
import importlib.util
import io
import json
import sys
import tarfile
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

import numpy as np
import pytest
import torch
from PIL import Image

from fedtsp.core.config import RunConfig
from fedtsp.data import ImageDataset, dataset_info, synthetic_dataset

if TYPE_CHECKING:  # the engine imports every method: only the tests that use it load it
    from fedtsp.engine.client_round import ClientReply, RoundWork
    from fedtsp.engine.simulation import PreparedRun

# One intra-op thread: the tests' models are tiny, and with two threads a second busy
# process on a 2-core machine makes every op wait on spinning OpenMP workers (10x slower).
torch.set_num_threads(1)

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"
CIFAR10_ARCHIVE = SHARED_DATA / "cifar10-jpg.tar.gz"

CIFAR10_CLASSES = list(dataset_info("cifar10").classes)


def load_script(path: str) -> ModuleType:
    """A script under benchmarks/ (e.g. "audits/speed_vs_htfllib") as a module, with its own
    folder importable as when it runs."""
    file = REPO / "benchmarks" / f"{path}.py"
    sys.path.insert(0, str(file.parent))
    spec = importlib.util.spec_from_file_location(file.stem, file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def tiny_data() -> ImageDataset:
    return synthetic_dataset()


def tiny_config(**changes) -> RunConfig:
    """A few-second federated run: 4 clients of the small CPU family."""
    base = RunConfig(
        dataset="cifar10",
        alpha=1.0,
        num_clients=4,
        family="htfe-cpu",
        algorithm="local",
        rounds=3,
        local_epochs=1,
        batch_size=20,
        seed=0,
    )
    return base.replace(**changes)


# Config fields added after the first run records, each hash-neutral at its default.
LATER_FIELDS = (
    "setting",
    "channels_last",
    "batch_order",
    "client_init",
    "undersized_clients",
    "population",
)


def key_before_fields(config: RunConfig, extra: dict | None = None) -> str:
    """The key `config` had before LATER_FIELDS existed (the original hashing rule)."""
    old = {k: v for k, v in config.to_dict().items() if k not in LATER_FIELDS}
    blob = json.dumps({"config": old, "extra": extra or {}}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def assert_uploads_training_means(client_half, client, module, key: str) -> torch.Tensor:
    """Train `client` two epochs with `client_half` (a run's client half), recording
    `module`'s outputs and the labels of every batch, then check that
    `client_half.upload(client)[key]` holds their per-class means (the authors' code collects
    class means on the training forward passes). Returns the recorded labels."""
    seen, labels = [], []

    def spy(c, x, y):
        labels.append(y)
        return client_half.train_loss(c, x, y)

    hook = module.register_forward_hook(lambda m, i, out: seen.append(out.detach().float()))
    client.train(spy, 2, 20, torch.Generator().manual_seed(0))
    hook.remove()
    values, ys = torch.cat(seen), torch.cat(labels)
    upload = client_half.upload(client)
    for c in ys.unique().tolist():
        torch.testing.assert_close(upload[key][c], values[ys == c].mean(0), rtol=1e-4, atol=1e-5)
    # The counts are the features each mean holds (here: two epochs of every batch).
    assert torch.equal(upload["counts"], torch.bincount(ys, minlength=client.num_classes))
    return ys


class RecordingTransport:
    """The simulator's in-process transport, keeping what crossed it in its last round:
    every client's upload and the message the server sent each client. `before_deliver(run)`,
    if given, runs after the server's step and before the clients receive its messages (to
    look at the clients as their training left them)."""

    def __init__(self, run: PreparedRun, before_deliver: Callable | None = None) -> None:
        self.run, self.inner, self.before_deliver = run, run.transport, before_deliver
        self.uploads: dict[int, dict] = {}
        self.messages: dict[int, dict] = {}

    def client_round(self, work: RoundWork) -> dict[int, ClientReply]:
        replies = self.inner.client_round(work)
        self.uploads = {i: r.upload for i, r in replies.items() if r.upload is not None}
        return replies

    def deliver(self, messages: dict[int, dict]) -> float:
        self.messages = messages
        if self.before_deliver is not None:
            self.before_deliver(self.run)
        return self.inner.deliver(messages)


def record_round(
    run: PreparedRun, t: int, before_deliver: Callable | None = None
) -> tuple[dict, dict[int, dict], dict[int, dict]]:
    """Round `t` of a started run through the engine (evaluate, train and upload on every
    client, server aggregate + configure, deliver): its history row, the clients' uploads and
    the server's messages (each by client id). `before_deliver`: see RecordingTransport."""
    transport = RecordingTransport(run, before_deliver)
    row = run.loop(transport).round(t)
    return row, transport.uploads, transport.messages


@pytest.fixture
def cifar10_archive() -> Path:
    if not CIFAR10_ARCHIVE.exists():
        pytest.skip(f"offline CIFAR-10 archive not found at {CIFAR10_ARCHIVE}")
    return CIFAR10_ARCHIVE


@pytest.fixture(scope="session")
def tiny_archive(tmp_path_factory) -> Path:
    """An image-folder archive in the layout of shared/data (3 images per class and split)."""
    path = tmp_path_factory.mktemp("data") / "cifar10-jpg.tar.gz"
    rng = np.random.default_rng(0)
    with tarfile.open(path, "w:gz") as tar:
        for split in ("train", "test"):
            for name in CIFAR10_CLASSES:
                for i in range(3):
                    buf = io.BytesIO()
                    pixels = rng.integers(0, 255, (32, 32, 3), dtype=np.uint8)
                    Image.fromarray(pixels).save(buf, format="JPEG")
                    info = tarfile.TarInfo(f"cifar10/{split}/{name}/{i:04d}.jpg")
                    info.size = buf.tell()
                    buf.seek(0)
                    tar.addfile(info, buf)
    return path


def history_rows(history: list[dict]) -> list[dict]:
    """A run's history without its timings: what two engines must agree on exactly."""
    return [{k: v for k, v in row.items() if k not in ("timings", "wall")} for row in history]


def native_setting(algorithm: str) -> dict:
    """Setting (and, for the homogeneous ones, a one-architecture family) a method runs in."""
    from fedtsp.algorithms import get_algorithm

    setting = get_algorithm(algorithm).settings[0]
    return {} if setting == "htfl" else {"setting": setting, "family": "homo-cpu"}


@pytest.fixture(scope="module")
def ray_cluster():
    """A local Ray cluster of 2 CPUs for the module's tests (Ray comes with the dev extra)."""
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()

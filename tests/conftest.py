"""Shared fixtures: a tiny learnable synthetic dataset and paths to the offline data."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from fedtsp.config import RunConfig
from fedtsp.data import ImageDataset, dataset_info

# One intra-op thread: the tests' models are tiny, and with two threads a second busy
# process on a 2-core machine makes every op wait on spinning OpenMP workers (10x slower).
torch.set_num_threads(1)

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"
CIFAR10_ARCHIVE = SHARED_DATA / "cifar10-jpg.tar.gz"

CIFAR10_CLASSES = list(dataset_info("cifar10").classes)


def synthetic_dataset(per_class: int = 60, seed: int = 0, size: int = 32) -> ImageDataset:
    """CIFAR-10-shaped images whose class is a smooth random colour pattern plus noise.

    Small CNNs separate the classes within a few epochs, so "well above chance" is a
    meaningful bar for a handful of federated rounds.
    """
    rng = np.random.default_rng(seed)
    coarse = rng.uniform(0, 255, size=(10, 3, 4, 4))
    patterns = coarse.repeat(size // 4, axis=2).repeat(size // 4, axis=3)

    def split(n: int) -> tuple[np.ndarray, np.ndarray]:
        labels = np.repeat(np.arange(10), n)
        noise = rng.normal(0, 40, size=(len(labels), 3, size, size))
        images = np.clip(patterns[labels] + noise, 0, 255).astype(np.uint8)
        return images, labels.astype(np.int64)

    train_x, train_y = split(per_class)
    test_x, test_y = split(max(per_class // 5, 2))
    return ImageDataset(
        name="cifar10",
        classes=list(CIFAR10_CLASSES),
        train_images=train_x,
        train_labels=train_y,
        test_images=test_x,
        test_labels=test_y,
        source=f"synthetic(seed={seed})",
        checksum=f"synthetic-{seed}-{per_class}-{size}",
    )


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


@pytest.fixture
def cifar10_archive() -> Path:
    if not CIFAR10_ARCHIVE.exists():
        pytest.skip(f"offline CIFAR-10 archive not found at {CIFAR10_ARCHIVE}")
    return CIFAR10_ARCHIVE

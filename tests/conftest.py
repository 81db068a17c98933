"""Shared fixtures: a tiny learnable synthetic dataset and paths to the offline data."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fedtsp.config import RunConfig
from fedtsp.data import ImageDataset, dataset_info, synthetic_dataset

# One intra-op thread: the tests' models are tiny, and with two threads a second busy
# process on a 2-core machine makes every op wait on spinning OpenMP workers (10x slower).
torch.set_num_threads(1)

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"
CIFAR10_ARCHIVE = SHARED_DATA / "cifar10-jpg.tar.gz"

CIFAR10_CLASSES = list(dataset_info("cifar10").classes)


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

"""Synthetic stand-ins for the registered datasets: real class names, learnable images.

Each class is a smooth random colour pattern plus pixel noise, so small CNNs separate the
classes within a few epochs. Used by the tests and by the ``smoke`` profile, which must
run the whole pipeline in minutes without any downloaded data.
"""

from __future__ import annotations

import numpy as np

from fedtsp.data.images import DatasetNotFoundError, ImageDataset
from fedtsp.data.registry import dataset_info


def synthetic_dataset(
    name: str = "cifar10", per_class: int = 60, seed: int = 0, size: int | None = None
) -> ImageDataset:
    """A dataset shaped like ``name`` (classes, channels, image size) with ``per_class`` train
    images per class; the test split holds ``max(per_class // 5, 2)`` per class.

    Tiny-ImageNet has no stand-in: its class list comes from the data itself.
    """
    info = dataset_info(name)
    if not info.classes:
        raise DatasetNotFoundError(
            f"{info.title} has no synthetic stand-in (its classes are read from the data)"
        )
    size = info.image_size if size is None else size
    if per_class < 1:
        raise ValueError(f"per_class={per_class} is invalid; must be >= 1")
    if size < 4 or size % 4:
        raise ValueError(f"size={size} is invalid; must be a multiple of 4 (>= 4)")
    num_classes = len(info.classes)
    channels = info.channels
    rng = np.random.default_rng(seed)
    coarse = rng.uniform(0, 255, size=(num_classes, channels, 4, 4))
    patterns = coarse.repeat(size // 4, axis=2).repeat(size // 4, axis=3)

    def split(n: int) -> tuple[np.ndarray, np.ndarray]:
        labels = np.repeat(np.arange(num_classes), n)
        noise = rng.normal(0, 40, size=(len(labels), channels, size, size))
        images = np.clip(patterns[labels] + noise, 0, 255).astype(np.uint8)
        return images, labels.astype(np.int64)

    train_x, train_y = split(per_class)
    test_x, test_y = split(max(per_class // 5, 2))
    return ImageDataset(
        name=info.name,
        classes=list(info.classes),
        train_images=train_x,
        train_labels=train_y,
        test_images=test_x,
        test_labels=test_y,
        source=f"synthetic(seed={seed})",
        checksum=f"synthetic-{info.name}-{seed}-{per_class}-{size}",
    )

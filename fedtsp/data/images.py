"""A decoded dataset in memory, its normalisation and device layout, and the two data errors."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from fedtsp.core.errors import UserError


class DatasetNotFoundError(UserError, FileNotFoundError):
    """No usable copy of a dataset was found in any of the places looked in."""


class DatasetFormatError(UserError, ValueError):
    """A copy of a dataset was found but its content does not match the dataset."""


@dataclass
class ImageDataset:
    """A decoded dataset: uint8 NCHW images and int64 labels for the train and test splits.

    For Tiny-ImageNet, ``classes`` are the WordNet ids (sorted, as torchvision's ImageFolder
    orders them), ``class_words`` their ``words.txt`` entries, and the test split is the
    official validation set (the official test labels are unreleased).
    """

    name: str
    classes: list[str]
    train_images: np.ndarray
    train_labels: np.ndarray
    test_images: np.ndarray
    test_labels: np.ndarray
    source: str
    checksum: str
    checksum_of: str = "archive"
    # Human-readable class names (Tiny-ImageNet's words.txt); equal to `classes` otherwise.
    class_words: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.class_words:
            self.class_words = list(self.classes)

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    @property
    def image_size(self) -> int:
        return int(self.train_images.shape[-1])

    @property
    def channels(self) -> int:
        return int(self.train_images.shape[1])

    def __repr__(self) -> str:
        return (
            f"ImageDataset({self.name!r}, classes={self.num_classes}, "
            f"train={tuple(self.train_images.shape)}, test={tuple(self.test_images.shape)}, "
            f"source={self.source!r})"
        )


def normalize(images_uint8: torch.Tensor | np.ndarray) -> torch.Tensor:
    """uint8 images -> float32 in [-1, 1] (mean 0.5, std 0.5 per channel).

    Computed as ``(x / 255 - 0.5) / 0.5``, the same operations as torchvision's
    ``ToTensor`` + ``Normalize(0.5, 0.5)``, so the values match HtFLlib's bit for bit.
    """
    x = torch.as_tensor(images_uint8)
    if x.dtype != torch.uint8:
        raise TypeError(f"normalize expects uint8 images, got {x.dtype}")
    return (x.to(torch.float32).div(255.0) - 0.5) / 0.5


def pixels(images: torch.Tensor) -> torch.Tensor:
    """`normalize`'s inverse: the uint8 images back from their [-1, 1] floats (exactly)."""
    x = images.detach().float().contiguous()
    return ((x * 0.5 + 0.5) * 255.0).round().clamp(0, 255).to(torch.uint8)


# Names of the image memory layouts (CLI / benchmark) -> `device_images`'s channels_last.


def device_images(
    images_uint8: torch.Tensor | np.ndarray,
    device: torch.device | str,
    channels_last: bool | None = None,
) -> torch.Tensor:
    """``normalize`` on ``device``, in the channels-last (NHWC) or the NCHW memory layout.

    The values are the same in either layout; only float rounding inside the convolutions
    differs. ``None`` picks the faster one measured with ``benchmarks/bench.py --part
    models``: NHWC on CPU (every client model trains 1.3-2x faster), NCHW on CUDA (fp32 at
    batch 100 on an H200, NHWC made most ResNets 10-35 % slower). Slicing or indexing a
    batch out of the tensor keeps its layout.
    """
    x = normalize(images_uint8).to(device)
    if channels_last is None:
        channels_last = x.device.type == "cpu"
    return x.contiguous(memory_format=torch.channels_last) if channels_last else x

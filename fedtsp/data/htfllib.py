"""Export / import a partition in the HtFLlib (PFLlib) on-disk layout.

Layout written by HtFLlib's dataset generators and read by its ``read_client_data``::

    <dir>/config.json
    <dir>/train/<i>.npz    np.savez_compressed(f, data={"x": x, "y": y})
    <dir>/test/<i>.npz

``x`` is float32 NCHW normalised with mean 0.5 / std 0.5 (the generators' ``ToTensor`` +
``Normalize``), ``y`` int64. The dict is pickled inside the ``.npz``, so loading needs
``allow_pickle=True``: only import folders you trust.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch

from fedtsp.core.atomic import atomic_save
from fedtsp.data.images import normalize
from fedtsp.data.partition import Partition

__all__ = ["ClientTensors", "export_htfllib", "import_htfllib"]

# Keys HtFLlib writes into config.json; `meta` may not override them.
_HTFL_KEYS = (
    "num_clients",
    "num_classes",
    "non_iid",
    "balance",
    "partition",
    "Size of samples for labels in clients",
    "alpha",
    "batch_size",
)


class ClientTensors(NamedTuple):
    """One client's data as HtFLlib stores it."""

    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor


def export_htfllib(
    directory: str | Path,
    images: np.ndarray,
    labels: np.ndarray,
    partition: Partition,
    meta: dict[str, Any] | None = None,
) -> Path:
    """Write ``partition`` of the merged ``images`` (uint8 NCHW) / ``labels`` in HtFLlib's layout.

    ``meta`` adds our own JSON fields to config.json (e.g. dataset, seed, fraction, source,
    checksum). Returns the path of config.json.
    """
    images = np.asarray(images)
    labels = np.asarray(labels)
    if images.dtype != np.uint8 or images.ndim != 4:
        raise ValueError(f"images must be uint8 NCHW, got {images.dtype} {images.shape}")
    if labels.shape != (images.shape[0],) or not np.array_equal(labels, partition.labels):
        raise ValueError("labels must be the merged labels the partition was drawn from")
    meta = dict(meta or {})
    clash = sorted(set(meta) & set(_HTFL_KEYS))
    if clash:
        raise ValueError(f"meta may not override HtFLlib's config keys {clash}")
    root = Path(directory)
    for sub in ("train", "test"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    for i in range(partition.num_clients):
        for sub, idx in (("train", partition.client_train[i]), ("test", partition.client_test[i])):
            data = {
                "x": normalize(images[idx]).numpy(),
                "y": labels[idx].astype(np.int64),
            }
            atomic_save(root / sub / f"{i}.npz", lambda f, d=data: np.savez_compressed(f, data=d))
    config = {
        "num_clients": partition.num_clients,
        "num_classes": partition.num_classes,
        "non_iid": True,
        "balance": False,
        "partition": "dir",
        "Size of samples for labels in clients": partition.label_histogram(),
        "alpha": partition.alpha,
        "batch_size": partition.batch_size,
        **meta,
    }
    text = json.dumps(config, indent=1)
    # config.json last: its presence marks a complete export.
    atomic_save(root / "config.json", lambda f: f.write(text.encode()))
    return root / "config.json"


def _read_client_file(path: Path) -> tuple[torch.Tensor, torch.Tensor]:
    if not path.is_file():
        raise FileNotFoundError(f"HtFLlib client file {path} is missing")
    with open(path, "rb") as f:
        data = np.load(f, allow_pickle=True)["data"].tolist()
    if not isinstance(data, dict) or "x" not in data or "y" not in data:
        raise ValueError(f"{path} does not hold a {{'x': ..., 'y': ...}} dict under 'data'")
    x = torch.from_numpy(np.asarray(data["x"], dtype=np.float32))
    y = torch.from_numpy(np.asarray(data["y"], dtype=np.int64))
    if x.shape[0] != y.shape[0]:
        raise ValueError(f"{path}: {x.shape[0]} inputs but {y.shape[0]} labels")
    return x, y


def import_htfllib(directory: str | Path) -> tuple[list[ClientTensors], dict[str, Any]]:
    """Read an HtFLlib dataset folder: per-client (x_train, y_train, x_test, y_test), config."""
    root = Path(directory)
    cfg_path = root / "config.json"
    if not cfg_path.is_file():
        raise FileNotFoundError(f"{cfg_path} not found; is {root} an HtFLlib dataset folder?")
    config = json.loads(cfg_path.read_text())
    n = config.get("num_clients")
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"{cfg_path}: num_clients must be a positive integer, got {n!r}")
    clients = []
    for i in range(n):
        x_tr, y_tr = _read_client_file(root / "train" / f"{i}.npz")
        x_te, y_te = _read_client_file(root / "test" / f"{i}.npz")
        clients.append(ClientTensors(x_tr, y_tr, x_te, y_te))
    return clients, config

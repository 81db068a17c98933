"""The decoded-array cache: one entry per source (name, kind, path, fingerprint), stored once."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
import uuid
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from fedtsp.data.images import ImageDataset
from fedtsp.data.registry import DatasetInfo

# Bumped whenever the cached arrays' layout or the decoding changes, so old entries are ignored.
CACHE_VERSION = 1

_ARRAYS = ("train_images", "train_labels", "test_images", "test_labels")


def source_key(info: DatasetInfo, kind: str, path: Path, fingerprint: str) -> str:
    blob = json.dumps(
        {
            "v": CACHE_VERSION,
            "dataset": info.name,
            "kind": kind,
            "path": str(path),
            "fp": fingerprint,
        },
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode()).hexdigest()


def read_cache(entry: Path) -> ImageDataset | None:
    meta_file = entry / "meta.json"
    if not meta_file.is_file():
        return None
    try:
        meta = json.loads(meta_file.read_text())
        if meta.get("version") != CACHE_VERSION:
            return None
        arrays = {k: np.load(entry / f"{k}.npy", allow_pickle=False) for k in _ARRAYS}
    except (OSError, ValueError):
        return None  # a damaged entry is rebuilt from the source
    return ImageDataset(
        name=meta["dataset"],
        classes=list(meta["classes"]),
        source=meta["source"],
        checksum=meta["checksum"],
        checksum_of=meta["checksum_of"],
        class_words=list(meta["class_words"]),
        **arrays,
    )


def write_cache(entry: Path, ds: ImageDataset, extra: dict) -> None:
    """Write a cache entry atomically: fill a temporary folder, then rename it into place."""
    entry.parent.mkdir(parents=True, exist_ok=True)
    tmp = entry.parent / f".{entry.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        for k in _ARRAYS:
            np.save(tmp / f"{k}.npy", getattr(ds, k), allow_pickle=False)
        meta = {
            "version": CACHE_VERSION,
            "dataset": ds.name,
            "classes": ds.classes,
            "class_words": ds.class_words,
            "source": ds.source,
            "checksum": ds.checksum,
            "checksum_of": ds.checksum_of,
            "created": time.time(),
            **extra,
        }
        (tmp / "meta.json").write_text(json.dumps(meta, indent=1))
        if entry.exists():  # a damaged or stale entry: move it aside first
            stale = entry.parent / f".{entry.name}.stale-{uuid.uuid4().hex[:8]}"
            os.replace(entry, stale)
            shutil.rmtree(stale, ignore_errors=True)
        try:
            os.replace(tmp, entry)
        except OSError:
            if not (entry / "meta.json").is_file():  # not just another process winning the race
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def latest_cache_entry(root: Path, info: DatasetInfo) -> Path | None:
    best: tuple[float, Path] | None = None
    for meta_file in root.glob(f"{info.name}-*/meta.json"):
        try:
            meta = json.loads(meta_file.read_text())
        except (OSError, ValueError):
            continue
        if meta.get("version") == CACHE_VERSION and meta.get("dataset") == info.name:
            created = float(meta.get("created", 0.0))
            if best is None or created > best[0]:
                best = (created, meta_file.parent)
    return None if best is None else best[1]


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def sha256_arrays(arrays: Iterable[np.ndarray]) -> str:
    h = hashlib.sha256()
    for a in arrays:
        h.update(np.ascontiguousarray(a).data)
    return h.hexdigest()

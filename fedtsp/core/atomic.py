"""Atomic file writes: a reader never sees a half-written file, even after a crash."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any


def atomic_save(path: Path, writer: Callable[[IO[bytes]], Any]) -> None:
    """Call ``writer(file_object)`` into a temporary file, then move it to ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            writer(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_bytes(path: Path, data: bytes) -> None:
    atomic_save(path, lambda handle: handle.write(data))


def atomic_write_text(path: Path, text: str) -> None:
    """Write UTF-8 text atomically (a reader never sees half a file)."""
    atomic_write_bytes(Path(path), text.encode("utf-8"))

"""Every environment variable the package reads, in one place, with the defaults they override.

``FEDTSP_DATA``: a dataset file or folder tried before the default places (`load_dataset`,
and a profile's ``data: auto``). ``FEDTSP_CACHE``: the cache root (decoded datasets, FMCL
embeddings, the WordNet copy), default ``~/.cache/fedtsp``. ``FEDTSP_DEBUG``: any value but
empty or 0 gives user errors their full traceback. ``WNSEARCHDIR`` (WordNet's own variable): a
WordNet database folder tried before the Debian packages' ``/usr/share/wordnet``. An API key is read from the variable the
user names (``fedtsp describe --api-key-env``), never from a file or a flag.
"""

from __future__ import annotations

import os
from pathlib import Path

DATA = "FEDTSP_DATA"
CACHE = "FEDTSP_CACHE"
DEBUG = "FEDTSP_DEBUG"
WORDNET = "WNSEARCHDIR"
DEFAULT_CACHE = Path("~/.cache/fedtsp")


def data_path() -> Path | None:
    """$FEDTSP_DATA as a path, or None when it is unset or empty."""
    value = os.environ.get(DATA)
    return Path(value).expanduser() if value else None


def cache_root(explicit: str | Path | None = None) -> Path:
    """The cache root: `explicit` if given, else $FEDTSP_CACHE, else ~/.cache/fedtsp."""
    if explicit is not None:
        return Path(explicit).expanduser()
    value = os.environ.get(CACHE)
    return Path(value).expanduser() if value else DEFAULT_CACHE.expanduser()


def wordnet_dir() -> Path | None:
    """$WNSEARCHDIR as a path, or None when it is unset or empty."""
    value = os.environ.get(WORDNET)
    return Path(value) if value else None


def debug_requested() -> bool:
    """FEDTSP_DEBUG=1 (or any value but 0/empty) asks for full tracebacks of user errors."""
    return os.environ.get(DEBUG, "") not in ("", "0")


def secret(name: str) -> str | None:
    """The stripped value of the environment variable `name` (an API key), or None."""
    return os.environ.get(name, "").strip() or None

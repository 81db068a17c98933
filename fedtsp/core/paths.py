"""Paths as committed outputs may hold them: never an absolute path of this machine.

Run records, tables and executed notebooks are committed and compared byte for byte when
they are regenerated elsewhere, so a path in them is written relative to the repository
(`../shared/data/...` for the data beside it), under `~` for the home folder, or reduced to
its file name; the data's identity is its checksum, not where it lay.
"""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def portable_path(path: str | Path) -> str:
    """`path` relative to the repository (or its parent folder), under ~, or its name alone."""
    text = str(path)
    p = Path(text).expanduser()
    if not p.is_absolute():
        return text
    p = Path(os.path.normpath(p))
    for base, prefix in ((REPO_ROOT, ""), (REPO_ROOT.parent, "../")):
        if p == base or base in p.parents:
            rel = p.relative_to(base).as_posix()
            return (prefix + rel) if rel != "." else (prefix.rstrip("/") or ".")
    home = Path.home()
    if home != Path("/") and home in p.parents:
        return "~/" + p.relative_to(home).as_posix()
    return f"<elsewhere>/{p.name}"


def scrub_paths(text: str) -> str:
    """`text` with this machine's repository, its parent folder and home folder written portably."""
    for base, short in ((REPO_ROOT, "."), (REPO_ROOT.parent, ".."), (Path.home(), "~")):
        if str(base) in ("/", ""):
            continue
        text = text.replace(f"{base}/", f"{short}/")
    return text

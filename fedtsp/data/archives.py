"""One read-only view over folders, zip and tar archives: every decoder reads each the same way."""

from __future__ import annotations

import hashlib
import os
import tarfile
import zipfile
from collections.abc import Iterable
from pathlib import Path


class Tree:
    """Files of a folder or an archive, by relative POSIX path."""

    names: list[str]

    def read(self, name: str) -> bytes:
        raise NotImplementedError


class DirTree(Tree):
    def __init__(self, root: Path, include: Iterable[str] | None = None) -> None:
        self.root = root
        self.names = []
        tops = [root / p for p in include] if include is not None else [root]
        for top in tops:
            if top.is_file():
                self.names.append(top.relative_to(root).as_posix())
                continue
            for dirpath, dirnames, filenames in os.walk(top):
                dirnames.sort()
                rel = Path(dirpath).relative_to(root)
                self.names.extend((rel / f).as_posix() for f in sorted(filenames))

    def read(self, name: str) -> bytes:
        return (self.root / name).read_bytes()

    def fingerprint(self) -> str:
        # Size and mtime of every file: cheap, and changes when any file does.
        h = hashlib.sha256()
        for name in self.names:
            st = (self.root / name).stat()
            h.update(f"{name}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
        return h.hexdigest()


class _ZipTree(Tree):
    def __init__(self, path: Path) -> None:
        self._zip = zipfile.ZipFile(path)
        self.names = [i.filename for i in self._zip.infolist() if not i.is_dir()]

    def read(self, name: str) -> bytes:
        return self._zip.read(name)


class _TarTree(Tree):
    def __init__(self, path: Path) -> None:
        # A compressed tar has no random access: read every member once, in one pass.
        self._files: dict[str, bytes] = {}
        with tarfile.open(path, "r:*") as tf:
            for member in tf:
                if member.isfile():
                    f = tf.extractfile(member)
                    if f is not None:
                        self._files[_clean(member.name)] = f.read()
        self.names = list(self._files)

    def read(self, name: str) -> bytes:
        return self._files[name]


def _clean(name: str) -> str:
    while name.startswith("./"):
        name = name[2:]
    return name.lstrip("/")


def is_archive(path: Path) -> bool:
    n = path.name.lower()
    return n.endswith((".zip", ".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tar.xz"))


def open_archive(path: Path) -> Tree:
    if path.name.lower().endswith(".zip"):
        return _ZipTree(path)
    return _TarTree(path)

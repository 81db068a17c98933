"""Image datasets: a small registry, one loader for every supported on-disk layout, and a cache.

`load_dataset(name)` returns an `ImageDataset` with uint8 NCHW arrays. Sources are tried in this
order (the first that has the dataset wins):

1. the explicit ``path`` argument, else the ``FEDTSP_DATA`` environment variable, then the
   dataset's default places (Fashion-MNIST: ``/usr/share/datasets/fashion-mnist``, where the
   Debian package ``dataset-fashion-mnist`` installs it). Each of them may be

   * the dataset itself, in its original layout: the CIFAR python tarball or its extracted
     ``cifar-10-batches-py`` / ``cifar-100-python`` folder, the Tiny-ImageNet
     ``tiny-imagenet-200`` folder or zip, a folder of Fashion-MNIST IDX files (gzipped or not);
   * an image-folder archive or folder laid out as ``[<top>/]{train,test}/<class>/<file>``
     (for example ``cifar10-jpg.tar.gz``, whose top folder is ``cifar10/``); class folder names
     must be the dataset's class names (compared after lower-casing and turning every run of
     non-alphanumerics into ``_``, so ``t_shirt_top`` names Fashion-MNIST's "T-shirt/top");
   * a folder that *contains* one of the above under a well-known name, see
     ``DatasetInfo.candidates`` (e.g. ``cifar-10-batches-py``, ``cifar10-jpg.tar.gz``).

   An explicit ``path`` that holds no usable copy is an error (no silent fallback to another
   copy); ``FEDTSP_DATA`` and the default places are simply skipped when they hold none.
2. the cache (``cache_dir``, else ``FEDTSP_CACHE``, else ``~/.cache/fedtsp``). Every decoded
   source is stored there once as ``.npy`` arrays per split, under a key made of the dataset
   name, the source's kind, its resolved path and a fingerprint (size and mtime of the archive,
   or of every file of a folder), so a changed or different source is decoded anew. With no
   source found in step 1, the most recently written cache entry of the dataset is used.
3. a torchvision download (CIFAR-10/100, Fashion-MNIST) into ``<cache>/torchvision`` when
   ``download=True``.

Otherwise `DatasetNotFoundError` names every place looked in and how to provide the data.

`ImageDataset.checksum` is the sha256 of the source archive file when the source is one file
(``checksum_of == "archive"``), and otherwise (folders, torchvision downloads) the sha256 of
the decoded arrays ``train_images, train_labels, test_images, test_labels`` concatenated as raw
bytes in that order (``checksum_of == "arrays"``).

Image order: image-folder layouts do not keep the original order, so their files are sorted by
(class index, file name); Tiny-ImageNet is read the same way. The CIFAR python and IDX layouts
keep their original order.
"""

from __future__ import annotations

import contextlib
import struct
import tarfile
import warnings
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fedtsp.core.environment import cache_root, data_path
from fedtsp.data.archives import DirTree, Tree, is_archive, open_archive
from fedtsp.data.cache import (
    latest_cache_entry,
    read_cache,
    sha256_arrays,
    sha256_file,
    source_key,
    write_cache,
)
from fedtsp.data.decoders import DECODERS, short_list, slug
from fedtsp.data.images import DatasetFormatError, DatasetNotFoundError, ImageDataset
from fedtsp.data.registry import DatasetInfo, dataset_info


@dataclass
class _Source:
    """A located copy of a dataset: what it is and how to read it."""

    path: Path
    fmt: str | None  # known for folders; None for archives (found out after opening)
    include: tuple[str, ...] | None = None  # sub-paths of a folder to read

    @property
    def is_file(self) -> bool:
        return self.path.is_file()


def _folder_format(p: Path, info: DatasetInfo) -> _Source | None:
    """Does the folder itself hold the dataset in one of its layouts? (cheap checks only)"""
    for fmt in info.formats:
        if fmt == "cifar-python":
            if info.name == "cifar10" and (p / "data_batch_1").is_file():
                return _Source(p, fmt)
            if info.name == "cifar100" and (p / "train").is_file() and (p / "test").is_file():
                return _Source(p, fmt)
        elif fmt == "idx":
            if any((p / f"train-images-idx3-ubyte{s}").is_file() for s in ("", ".gz")):
                return _Source(p, fmt)
        elif fmt == "tiny-imagenet":
            if (p / "wnids.txt").is_file():
                return _Source(p, fmt, ("wnids.txt", "words.txt", "train", "val"))
        elif fmt == "image-folder" and (p / "train").is_dir() and (p / "test").is_dir():
            return _Source(p, fmt, ("train", "test"))
    return None


def _locate(p: Path, info: DatasetInfo) -> _Source | None:
    """A copy of the dataset at ``p`` itself, or under one of its well-known names inside ``p``."""
    if p.is_file():
        return _Source(p, None) if is_archive(p) else None
    if not p.is_dir():
        return None
    direct = _folder_format(p, info)
    if direct is not None:
        return direct
    for cand in info.candidates:
        q = p / cand
        if q.is_file() and is_archive(q):
            return _Source(q, None)
        if q.is_dir():
            found = _folder_format(q, info)
            if found is not None:
                return found
    return None


def _describe_expected(info: DatasetInfo) -> str:
    return (
        f"{info.title} in one of the layouts {', '.join(info.formats)}, "
        f"or a folder containing one of {', '.join(info.candidates)}"
    )


def _decode_source(src: _Source, info: DatasetInfo) -> ImageDataset:
    where = str(src.path)
    # A truncated or corrupt file shows up as any of these, while opening or decoding.
    damaged = (OSError, EOFError, tarfile.TarError, zipfile.BadZipFile, zlib.error, struct.error)
    try:
        if src.is_file:
            tree: Tree = open_archive(src.path)
            formats = info.formats
        else:
            tree = DirTree(src.path, src.include)
            formats = (src.fmt,) if src.fmt else info.formats
        decoded = None
        for fmt in formats:
            decoded = DECODERS[fmt](tree, info, where)
            if decoded is not None:
                break
    except damaged as exc:
        raise DatasetFormatError(
            f"{where} is damaged or truncated ({type(exc).__name__}: {exc}); replace it with a "
            f"complete copy of {info.title} ({info.how_to_get})"
        ) from exc
    if decoded is None:
        raise DatasetNotFoundError(f"{where} does not hold {_describe_expected(info)}")
    train_x, train_y, test_x, test_y, classes, words = decoded
    arrays = (train_x, train_y, test_x, test_y)
    if src.is_file:
        checksum, checksum_of = sha256_file(src.path), "archive"
    else:
        checksum, checksum_of = sha256_arrays(arrays), "arrays"
    _check_labels(arrays, len(classes), where)
    return ImageDataset(
        name=info.name,
        classes=classes,
        train_images=train_x,
        train_labels=train_y,
        test_images=test_x,
        test_labels=test_y,
        source=where,
        checksum=checksum,
        checksum_of=checksum_of,
        class_words=words,
    )


def _check_labels(arrays: tuple[np.ndarray, ...], num_classes: int, where: str) -> None:
    for y in (arrays[1], arrays[3]):
        if y.size and (y.min() < 0 or y.max() >= num_classes):
            raise DatasetFormatError(f"{where}: labels outside 0..{num_classes - 1}")


def _load_from_source(src: _Source, info: DatasetInfo, root: Path) -> ImageDataset:
    """Decoded arrays of a source, from the cache when this exact source was decoded before."""
    path = src.path.resolve()
    if src.is_file:
        st = path.stat()
        kind, fp = "archive", f"{st.st_size}:{st.st_mtime_ns}"
    else:
        kind, fp = f"folder:{src.fmt}", DirTree(path, src.include).fingerprint()
    key = source_key(info, kind, path, fp)
    entry = root / f"{info.name}-{key[:20]}"
    cached = read_cache(entry)
    if cached is not None:
        return cached
    ds = _decode_source(src, info)
    try:
        write_cache(entry, ds, {"key": key, "kind": kind})
    except OSError as exc:  # a read-only cache must not stop a run
        warnings.warn(f"could not write the dataset cache {entry}: {exc}", stacklevel=3)
    return ds


def _download_torchvision(info: DatasetInfo, root: Path) -> tuple[np.ndarray, ...]:
    """Download with torchvision; returns (train_x NCHW, train_y, test_x, test_y)."""
    import torchvision.datasets as tvd

    cls = getattr(tvd, str(info.torchvision))
    out: list[np.ndarray] = []
    for train in (True, False):
        d = cls(str(root), train=train, download=True)
        x = np.asarray(d.data, dtype=np.uint8)
        x = x[:, None] if x.ndim == 3 else x.transpose(0, 3, 1, 2)
        out += [np.ascontiguousarray(x), np.asarray(d.targets, dtype=np.int64)]
        names = list(getattr(d, "classes", []))
        if names and [slug(n) for n in names] != [slug(c) for c in info.classes]:
            raise DatasetFormatError(
                f"torchvision {info.torchvision} has classes {short_list(names)}"
            )
    return tuple(out)


def load_dataset(
    name: str,
    path: str | Path | None = None,
    cache_dir: str | Path | None = None,
    download: bool = True,
) -> ImageDataset:
    """Load a registered dataset as uint8 NCHW arrays; see the module docstring for the search.

    Raises `DatasetNotFoundError` (a FileNotFoundError) when no copy is found, and
    `DatasetFormatError` (a ValueError) when a copy is found but does not match the dataset.
    """
    info = dataset_info(name)
    root = cache_root(cache_dir)
    looked: list[str] = []

    # (1) explicit path: no fallback if it holds nothing usable.
    if path is not None:
        p = Path(path).expanduser()
        src = _locate(p, info)
        if src is None:
            what = "does not exist" if not p.exists() else "holds no usable copy"
            raise DatasetNotFoundError(
                f"{info.title} not found: the path {p} {what}; expected {_describe_expected(info)}."
            )
        return _load_from_source(src, info, root)

    places: list[tuple[str, Path]] = []
    env = data_path()
    if env is not None:
        places.append(("FEDTSP_DATA", env))
    else:
        looked.append("FEDTSP_DATA (not set)")
    places += [("default place", Path(d)) for d in info.default_places]
    for label, p in places:
        src = _locate(p, info)
        if src is not None:
            return _load_from_source(src, info, root)
        state = "does not exist" if not p.exists() else "no copy found"
        looked.append(f"{label} {p} ({state})")

    # (2) cache: any earlier decoded copy.
    entry = latest_cache_entry(root, info) if root.is_dir() else None
    if entry is not None:
        cached = read_cache(entry)
        if cached is not None:
            return cached
    looked.append(f"cache {root} (no decoded copy)")

    # (3) torchvision download.
    if info.torchvision is None:
        looked.append(f"download (torchvision has no {info.title})")
    elif not download:
        looked.append("torchvision download (disabled: download=False)")
    else:
        dl_root = root / "torchvision"
        try:
            arrays = _download_torchvision(info, dl_root)
        except Exception as exc:  # network, disk and archive errors all end here
            looked.append(f"torchvision download into {dl_root} (failed: {exc})")
        else:
            ds = ImageDataset(
                name=info.name,
                classes=list(info.classes),
                train_images=arrays[0],
                train_labels=arrays[1],
                test_images=arrays[2],
                test_labels=arrays[3],
                source=f"torchvision download into {dl_root}",
                checksum=sha256_arrays(arrays),
                checksum_of="arrays",
            )
            key = source_key(info, "torchvision", dl_root.resolve(), "")
            entry = root / f"{info.name}-{key[:20]}"
            # The download itself stays usable by torchvision if the cache cannot be written.
            with contextlib.suppress(OSError):
                write_cache(entry, ds, {"key": key, "kind": "torchvision"})
            return ds

    raise DatasetNotFoundError(
        f"{info.title} ({info.name}) not found; looked in: {'; '.join(looked)}. "
        f"Provide it with --data PATH or the FEDTSP_DATA environment variable (the dataset's "
        f"archive or folder, or a folder containing one of {', '.join(info.candidates)}), "
        f"or allow a torchvision download with internet access; source: {info.how_to_get}."
    )

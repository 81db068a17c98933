"""Decoders, one per on-disk layout; each returns (train_x, train_y, test_x, test_y, classes,
words)."""

from __future__ import annotations

import gzip
import io
import pickle
import re
import struct
import warnings

import numpy as np
import torch
from PIL import Image

from fedtsp.data.archives import Tree
from fedtsp.data.images import DatasetFormatError
from fedtsp.data.registry import DatasetInfo

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".ppm", ".tif", ".tiff", ".webp")

_Decoded = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, list[str], list[str]]


def slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_")


def _decode_image(data: bytes, channels: int, size: int, what: str) -> np.ndarray:
    """Decode one image file to a (size, size, channels) uint8 array."""
    try:
        with Image.open(io.BytesIO(data)) as im:
            mode = "RGB" if channels == 3 else "L"
            # Grayscale (or CMYK, palette) files are converted, e.g. Tiny-ImageNet's gray JPEGs.
            im = im if im.mode == mode else im.convert(mode)
            if im.size != (size, size):
                raise DatasetFormatError(
                    f"image {what} is {im.size[0]}x{im.size[1]}, expected {size}x{size}"
                )
            arr = np.frombuffer(im.tobytes(), dtype=np.uint8)
    except DatasetFormatError:
        raise
    except Exception as exc:  # Pillow raises several types for broken files
        raise DatasetFormatError(f"cannot decode image {what}: {exc}") from exc
    return arr.reshape(size, size, channels)


def _decode_jpeg_batch(blobs: list[bytes], size: int) -> list[np.ndarray] | None:
    """Decode RGB JPEGs with torchvision's batched libjpeg-turbo decoder; None if it can't.

    About 4x faster than Pillow (whose per-file Python parsing dominates for 32x32 images) and
    bit-identical to Pillow on both CIFAR JPEG archives.
    """
    try:
        with warnings.catch_warnings():
            # torchvision 0.29 deprecates its image codecs; once removed, Pillow takes over.
            warnings.simplefilter("ignore", DeprecationWarning)
            from torchvision.io import ImageReadMode, decode_jpeg

            tensors = [torch.frombuffer(bytearray(b), dtype=torch.uint8) for b in blobs]
            images = decode_jpeg(tensors, mode=ImageReadMode.RGB)
    except Exception:  # missing torchvision, CMYK or damaged files: Pillow explains better
        return None
    if any(tuple(im.shape) != (3, size, size) for im in images):
        return None  # let Pillow name the offending file
    return [im.numpy() for im in images]


def _decode_many(tree: Tree, names: list[str], channels: int, size: int, where: str) -> np.ndarray:
    """Decode image files to one contiguous uint8 NCHW array, in the order of ``names``."""
    out = np.empty((len(names), channels, size, size), dtype=np.uint8)
    chunk = 4096
    for start in range(0, len(names), chunk):
        part = names[start : start + chunk]
        blobs = [tree.read(n) for n in part]
        fast = None
        if channels == 3 and all(b[:3] == b"\xff\xd8\xff" for b in blobs):
            fast = _decode_jpeg_batch(blobs, size)
        for i, (name, blob) in enumerate(zip(part, blobs, strict=True)):
            if fast is not None:
                out[start + i] = fast[i]
            else:
                hwc = _decode_image(blob, channels, size, f"{where}:{name}")
                out[start + i] = hwc.transpose(2, 0, 1)
    return out


def _has_image_ext(name: str) -> bool:
    base = name.rsplit("/", 1)[-1]
    return not base.startswith(".") and base.lower().endswith(IMAGE_EXTENSIONS)


def _match_classes(folders: set[str], info: DatasetInfo, where: str) -> dict[str, int]:
    """Map class-folder names to label indices, or fail naming unknown / missing classes."""
    if info.classes:
        by_slug = {slug(c): i for i, c in enumerate(info.classes)}
        mapping = {f: by_slug[slug(f)] for f in folders if slug(f) in by_slug}
        unknown = sorted(folders - set(mapping))
        missing = sorted(set(info.classes) - {info.classes[i] for i in mapping.values()})
        if len(set(mapping.values())) != len(mapping):
            raise DatasetFormatError(
                f"{where}: two class folders map to the same {info.title} class"
            )
        if unknown or missing:
            parts = []
            if unknown:
                parts.append(f"unknown class folders {short_list(unknown)}")
            if missing:
                parts.append(f"missing class folders {short_list(missing)}")
            raise DatasetFormatError(
                f"{where}: {' and '.join(parts)}; {info.title} class folders must be named "
                f"{short_list(list(info.classes))}"
            )
        return mapping
    return {f: i for i, f in enumerate(sorted(folders))}


def short_list(items: list[str], n: int = 6) -> str:
    shown = ", ".join(items[:n])
    return f"[{shown}{', ...' if len(items) > n else ''}] ({len(items)})"


def _decode_image_folder(tree: Tree, info: DatasetInfo, where: str) -> _Decoded | None:
    """Layout ``[<top>/]{train,test}/<class>/<file>``; None when the tree has no such files."""
    entries: dict[str, list[tuple[str, str, str]]] = {"train": [], "test": []}
    tops: set[str] = set()
    for name in tree.names:
        parts = name.split("/")
        if len(parts) < 3 or parts[-3] not in entries or not _has_image_ext(name):
            continue
        tops.add("/".join(parts[:-3]))
        entries[parts[-3]].append((parts[-2], parts[-1], name))
    if not entries["train"] and not entries["test"]:
        return None
    if len(tops) > 1:
        raise DatasetFormatError(
            f"{where}: several image-folder roots {sorted(tops)}; keep one train/test pair"
        )
    for split in ("train", "test"):
        if not entries[split]:
            raise DatasetFormatError(f"{where}: no images under {split}/<class>/")
    train_folders = {c for c, _, _ in entries["train"]}
    test_folders = {c for c, _, _ in entries["test"]}
    mapping = _match_classes(train_folders, info, f"{where} (train)")
    test_mapping = _match_classes(test_folders, info, f"{where} (test)")
    if not info.classes and train_folders != test_folders:
        raise DatasetFormatError(f"{where}: train and test class folders differ")
    classes = list(info.classes) if info.classes else sorted(train_folders)
    arrays = []
    for split, m in (("train", mapping), ("test", test_mapping)):
        # Archives do not keep the original order: sort by (class, file name).
        rows = sorted((m[c], f, n) for c, f, n in entries[split])
        names = [n for _, _, n in rows]
        arrays.append(_decode_many(tree, names, info.channels, info.image_size, where))
        arrays.append(np.array([label for label, _, _ in rows], dtype=np.int64))
    return arrays[0], arrays[1], arrays[2], arrays[3], classes, list(classes)


class _CifarUnpickler(pickle.Unpickler):
    """Unpickler for the CIFAR batches that refuses anything but numpy arrays and bytes."""

    _ALLOWED = {
        ("numpy.core.multiarray", "_reconstruct"),
        ("numpy._core.multiarray", "_reconstruct"),
        ("numpy.core.multiarray", "scalar"),
        ("numpy._core.multiarray", "scalar"),
        ("numpy", "ndarray"),
        ("numpy", "dtype"),
        ("_codecs", "encode"),
    }

    def find_class(self, module: str, name: str):  # type: ignore[no-untyped-def]
        if (module, name) not in self._ALLOWED:
            raise pickle.UnpicklingError(f"refusing to load {module}.{name} from a CIFAR batch")
        if module == "numpy.core.multiarray":
            module = "numpy._core.multiarray" if hasattr(np, "_core") else module
        return super().find_class(module, name)


def _unpickle(data: bytes, what: str) -> dict:
    try:
        obj = _CifarUnpickler(io.BytesIO(data), encoding="bytes").load()
    except Exception as exc:
        raise DatasetFormatError(f"cannot read CIFAR batch {what}: {exc}") from exc
    if not isinstance(obj, dict):
        raise DatasetFormatError(f"CIFAR batch {what} is not a dict")
    return obj


def _decode_cifar_python(tree: Tree, info: DatasetInfo, where: str) -> _Decoded | None:
    if info.name == "cifar10":
        train_files, test_files, meta_file = (
            [f"data_batch_{i}" for i in range(1, 6)],
            ["test_batch"],
            "batches.meta",
        )
        label_key, names_key = b"labels", b"label_names"
    else:
        train_files, test_files, meta_file = ["train"], ["test"], "meta"
        label_key, names_key = b"fine_labels", b"fine_label_names"
    index = {n.rsplit("/", 1)[-1]: n for n in tree.names}
    needed = train_files + test_files
    if not all(f in index for f in needed):
        return None
    if meta_file in index:
        meta = _unpickle(tree.read(index[meta_file]), f"{where}:{meta_file}")
        names = [n.decode() if isinstance(n, bytes) else str(n) for n in meta.get(names_key, [])]
        if names and names != list(info.classes):
            raise DatasetFormatError(
                f"{where}: class names in {meta_file} are {short_list(names)}, "
                f"expected {info.title}'s {short_list(list(info.classes))}"
            )
    out = []
    for files in (train_files, test_files):
        xs, ys = [], []
        for f in files:
            batch = _unpickle(tree.read(index[f]), f"{where}:{f}")
            if b"data" not in batch or label_key not in batch:
                raise DatasetFormatError(f"{where}:{f} lacks {label_key.decode()!r} or 'data'")
            xs.append(np.asarray(batch[b"data"], dtype=np.uint8).reshape(-1, 3, 32, 32))
            ys.append(np.asarray(batch[label_key], dtype=np.int64))
        out += [np.ascontiguousarray(np.concatenate(xs)), np.concatenate(ys)]
    return out[0], out[1], out[2], out[3], list(info.classes), list(info.classes)


def _read_idx(data: bytes, what: str) -> np.ndarray:
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    if len(data) < 4 or data[:2] != b"\0\0" or data[2] != 0x08:
        raise DatasetFormatError(f"{what} is not an unsigned-byte IDX file")
    ndim = data[3]
    dims = struct.unpack(f">{ndim}I", data[4 : 4 + 4 * ndim])
    body = np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim)
    if body.size != int(np.prod(dims)):
        raise DatasetFormatError(f"{what}: header says {dims} but holds {body.size} values")
    return body.reshape(dims)


def _decode_idx(tree: Tree, info: DatasetInfo, where: str) -> _Decoded | None:
    index: dict[str, str] = {}
    for n in tree.names:
        base = n.rsplit("/", 1)[-1]
        index.setdefault(base.removesuffix(".gz"), n)
    stems = (
        "train-images-idx3-ubyte",
        "train-labels-idx1-ubyte",
        "t10k-images-idx3-ubyte",
        "t10k-labels-idx1-ubyte",
    )
    if not all(s in index for s in stems):
        return None
    xs = [_read_idx(tree.read(index[s]), f"{where}:{index[s]}") for s in stems]
    size = info.image_size
    out = []
    for images, labels in ((xs[0], xs[1]), (xs[2], xs[3])):
        if images.ndim != 3 or images.shape[1:] != (size, size) or len(images) != len(labels):
            raise DatasetFormatError(
                f"{where}: unexpected IDX shapes {images.shape}/{labels.shape}"
            )
        out += [np.ascontiguousarray(images[:, None]), labels.astype(np.int64)]
    return out[0], out[1], out[2], out[3], list(info.classes), list(info.classes)


def _decode_tiny_imagenet(tree: Tree, info: DatasetInfo, where: str) -> _Decoded | None:
    """Official Tiny-ImageNet layout; validation labels come from ``val_annotations.txt``."""
    wnid_files = sorted((n for n in tree.names if n.rsplit("/", 1)[-1] == "wnids.txt"), key=len)
    if not wnid_files:
        return None
    top = wnid_files[0][: -len("wnids.txt")]
    names = set(tree.names)
    ann_name = f"{top}val/val_annotations.txt"
    if ann_name not in names:
        raise DatasetFormatError(f"{where}: has wnids.txt but no val/val_annotations.txt")
    wnids = [w.strip() for w in tree.read(wnid_files[0]).decode().splitlines() if w.strip()]
    if len(set(wnids)) != len(wnids):
        raise DatasetFormatError(f"{where}: wnids.txt lists a class twice")
    # Sorted wnids, like torchvision's ImageFolder (wnids.txt itself is in no particular order).
    classes = sorted(wnids)
    label_of = {w: i for i, w in enumerate(classes)}
    words_map: dict[str, str] = {}
    if f"{top}words.txt" in names:
        for line in tree.read(f"{top}words.txt").decode("utf-8", "replace").splitlines():
            wnid, _, words = line.partition("\t")
            words_map[wnid.strip()] = words.strip()
    words = [words_map.get(w, w) for w in classes]

    train_rows = []
    for n in tree.names:
        parts = n[len(top) :].split("/") if n.startswith(top) else []
        if len(parts) == 4 and parts[0] == "train" and parts[2] == "images" and _has_image_ext(n):
            if parts[1] not in label_of:
                raise DatasetFormatError(f"{where}: train folder {parts[1]} is not in wnids.txt")
            train_rows.append((label_of[parts[1]], parts[3], n))
    missing = sorted(set(classes) - {classes[r[0]] for r in train_rows})
    if missing:
        raise DatasetFormatError(f"{where}: no training images for classes {short_list(missing)}")

    val_rows = []
    seen = set()
    for i, line in enumerate(tree.read(ann_name).decode().splitlines(), 1):
        if not line.strip():
            continue
        fields = line.split("\t")
        if len(fields) < 2 or fields[1].strip() not in label_of:
            raise DatasetFormatError(f"{ann_name} line {i}: bad entry {line!r}")
        fname = fields[0].strip()
        path = f"{top}val/images/{fname}"
        if path not in names:
            raise DatasetFormatError(f"{ann_name} line {i}: image val/images/{fname} is missing")
        seen.add(path)
        val_rows.append((label_of[fields[1].strip()], fname, path))
    unlabelled = [n for n in tree.names if n.startswith(f"{top}val/images/") and _has_image_ext(n)]
    unlabelled = sorted(set(unlabelled) - seen)
    if unlabelled:
        raise DatasetFormatError(f"{where}: val images without annotation {short_list(unlabelled)}")

    out = []
    for rows in (sorted(train_rows), sorted(val_rows)):
        out.append(_decode_many(tree, [r[2] for r in rows], 3, info.image_size, where))
        out.append(np.array([r[0] for r in rows], dtype=np.int64))
    return out[0], out[1], out[2], out[3], classes, words


DECODERS = {
    "cifar-python": _decode_cifar_python,
    "idx": _decode_idx,
    "tiny-imagenet": _decode_tiny_imagenet,
    "image-folder": _decode_image_folder,
}

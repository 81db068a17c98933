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
import gzip
import hashlib
import io
import json
import os
import pickle
import re
import shutil
import struct
import tarfile
import time
import uuid
import warnings
import zipfile
import zlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from fedtsp.errors import UserError

__all__ = [
    "DATASETS",
    "DatasetFormatError",
    "DatasetInfo",
    "DatasetNotFoundError",
    "ImageDataset",
    "dataset_info",
    "dataset_names",
    "load_dataset",
    "normalize",
    "semantic_groups",
]

# Bumped whenever the cached arrays' layout or the decoding changes, so old entries are ignored.
CACHE_VERSION = 1

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".ppm", ".tif", ".tiff", ".webp")


class DatasetNotFoundError(UserError, FileNotFoundError):
    """No usable copy of a dataset was found in any of the places looked in."""


class DatasetFormatError(UserError, ValueError):
    """A copy of a dataset was found but its content does not match the dataset."""


# --------------------------------------------------------------------------------------------
# Registry
# --------------------------------------------------------------------------------------------

_CIFAR10_CLASSES = (
    "airplane",
    "automobile",
    "bird",
    "cat",
    "deer",
    "dog",
    "frog",
    "horse",
    "ship",
    "truck",
)

# CIFAR-100's 20 superclasses (coarse labels 0..19) with their 5 fine classes each.
_CIFAR100_SUPERCLASSES: dict[str, list[str]] = {
    "aquatic_mammals": ["beaver", "dolphin", "otter", "seal", "whale"],
    "fish": ["aquarium_fish", "flatfish", "ray", "shark", "trout"],
    "flowers": ["orchid", "poppy", "rose", "sunflower", "tulip"],
    "food_containers": ["bottle", "bowl", "can", "cup", "plate"],
    "fruit_and_vegetables": ["apple", "mushroom", "orange", "pear", "sweet_pepper"],
    "household_electrical_devices": ["clock", "keyboard", "lamp", "telephone", "television"],
    "household_furniture": ["bed", "chair", "couch", "table", "wardrobe"],
    "insects": ["bee", "beetle", "butterfly", "caterpillar", "cockroach"],
    "large_carnivores": ["bear", "leopard", "lion", "tiger", "wolf"],
    "large_man-made_outdoor_things": ["bridge", "castle", "house", "road", "skyscraper"],
    "large_natural_outdoor_scenes": ["cloud", "forest", "mountain", "plain", "sea"],
    "large_omnivores_and_herbivores": ["camel", "cattle", "chimpanzee", "elephant", "kangaroo"],
    "medium_mammals": ["fox", "porcupine", "possum", "raccoon", "skunk"],
    "non-insect_invertebrates": ["crab", "lobster", "snail", "spider", "worm"],
    "people": ["baby", "boy", "girl", "man", "woman"],
    "reptiles": ["crocodile", "dinosaur", "lizard", "snake", "turtle"],
    "small_mammals": ["hamster", "mouse", "rabbit", "shrew", "squirrel"],
    "trees": ["maple_tree", "oak_tree", "palm_tree", "pine_tree", "willow_tree"],
    "vehicles_1": ["bicycle", "bus", "motorcycle", "pickup_truck", "train"],
    "vehicles_2": ["lawn_mower", "rocket", "streetcar", "tank", "tractor"],
}

# The official fine-label order is the alphabetical order of the fine class names.
_CIFAR100_CLASSES = tuple(sorted(c for group in _CIFAR100_SUPERCLASSES.values() for c in group))

_FMNIST_CLASSES = (
    "T-shirt/top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle boot",
)

_SEMANTIC_GROUPS: dict[str, dict[str, list[str]]] = {
    "cifar10": {
        "animals": ["bird", "cat", "deer", "dog", "frog", "horse"],
        "vehicles": ["airplane", "automobile", "ship", "truck"],
    },
    "cifar100": _CIFAR100_SUPERCLASSES,
    # Our own grouping (not from the paper): garments, shoes, bags.
    "fmnist": {
        "clothing": ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Shirt"],
        "footwear": ["Sandal", "Sneaker", "Ankle boot"],
        "bags": ["Bag"],
    },
    # Tiny-ImageNet has no agreed grouping of its 200 WordNet classes.
    "tinyimagenet": {},
}


@dataclass(frozen=True)
class DatasetInfo:
    """Static facts about a dataset and where its copies are looked for."""

    name: str
    title: str
    # Class names in label order; empty for Tiny-ImageNet, whose classes come from the data.
    classes: tuple[str, ...]
    num_classes: int
    image_size: int
    channels: int
    # Layouts the loader accepts for this dataset, most specific first.
    formats: tuple[str, ...]
    # Names looked for inside a data folder (originals before re-encoded image folders).
    candidates: tuple[str, ...]
    # Folders looked in after the path argument / FEDTSP_DATA.
    default_places: tuple[str, ...] = ()
    # torchvision.datasets class name for the download fallback, if any.
    torchvision: str | None = None
    how_to_get: str = ""


DATASETS: dict[str, DatasetInfo] = {
    "cifar10": DatasetInfo(
        name="cifar10",
        title="CIFAR-10",
        classes=_CIFAR10_CLASSES,
        num_classes=10,
        image_size=32,
        channels=3,
        formats=("cifar-python", "image-folder"),
        candidates=(
            "cifar-10-batches-py",
            "cifar-10-python.tar.gz",
            "cifar10-jpg.tar.gz",
            "cifar10-jpg.tgz",
            "cifar10-jpg",
            "cifar10",
            "CIFAR10",
            "cifar-10",
        ),
        torchvision="CIFAR10",
        how_to_get="https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz",
    ),
    "cifar100": DatasetInfo(
        name="cifar100",
        title="CIFAR-100",
        classes=_CIFAR100_CLASSES,
        num_classes=100,
        image_size=32,
        channels=3,
        formats=("cifar-python", "image-folder"),
        candidates=(
            "cifar-100-python",
            "cifar-100-python.tar.gz",
            "cifar100-jpg.tar.gz",
            "cifar100-jpg.tgz",
            "cifar100-jpg",
            "cifar100",
            "CIFAR100",
            "cifar-100",
        ),
        torchvision="CIFAR100",
        how_to_get="https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz",
    ),
    "tinyimagenet": DatasetInfo(
        name="tinyimagenet",
        title="Tiny-ImageNet",
        classes=(),
        num_classes=200,
        image_size=64,
        channels=3,
        formats=("tiny-imagenet", "image-folder"),
        candidates=(
            "tiny-imagenet-200",
            "tiny-imagenet-200.zip",
            "tinyimagenet",
            "tiny-imagenet",
            "TinyImageNet",
        ),
        how_to_get="http://cs231n.stanford.edu/tiny-imagenet-200.zip (no torchvision download)",
    ),
    "fmnist": DatasetInfo(
        name="fmnist",
        title="Fashion-MNIST",
        classes=_FMNIST_CLASSES,
        num_classes=10,
        image_size=28,
        channels=1,
        formats=("idx", "image-folder"),
        candidates=("fashion-mnist", "FashionMNIST/raw", "FashionMNIST", "fmnist"),
        default_places=("/usr/share/datasets/fashion-mnist",),
        torchvision="FashionMNIST",
        how_to_get="apt-get install dataset-fashion-mnist, or torchvision's FashionMNIST",
    ),
}

_ALIASES = {
    "cifar10": "cifar10",
    "cifar100": "cifar100",
    "tinyimagenet": "tinyimagenet",
    "tinyimagenet200": "tinyimagenet",
    "tiny": "tinyimagenet",
    "fmnist": "fmnist",
    "fashionmnist": "fmnist",
}


def dataset_names() -> list[str]:
    """Canonical names of the registered datasets."""
    return list(DATASETS)


def dataset_info(name: str) -> DatasetInfo:
    """Registry entry of a dataset; accepts spellings like ``CIFAR-10`` or ``fashion_mnist``."""
    key = re.sub(r"[^a-z0-9]", "", str(name).lower())
    if key not in _ALIASES:
        raise ValueError(f"unknown dataset {name!r}; choose one of {', '.join(DATASETS)}")
    return DATASETS[_ALIASES[key]]


def semantic_groups(name: str) -> dict[str, list[str]]:
    """Semantic groups of class names used by the semantic-gap metric.

    CIFAR-10: animals / vehicles (the paper's). CIFAR-100: the 20 official superclasses.
    Fashion-MNIST: clothing / footwear / bags (ours). Tiny-ImageNet: ``{}`` (none defined).
    """
    info = dataset_info(name)
    return {group: list(members) for group, members in _SEMANTIC_GROUPS[info.name].items()}


# --------------------------------------------------------------------------------------------
# The dataset object
# --------------------------------------------------------------------------------------------


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


# Names of the image memory layouts (CLI / benchmark) -> `device_images`'s channels_last.
LAYOUTS: dict[str, bool | None] = {"auto": None, "channels-last": True, "nchw": False}


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


# --------------------------------------------------------------------------------------------
# File trees: one read-only view over folders, zip and tar archives
# --------------------------------------------------------------------------------------------


class _Tree:
    """Files of a folder or an archive, by relative POSIX path."""

    names: list[str]

    def read(self, name: str) -> bytes:
        raise NotImplementedError


class _DirTree(_Tree):
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


class _ZipTree(_Tree):
    def __init__(self, path: Path) -> None:
        self._zip = zipfile.ZipFile(path)
        self.names = [i.filename for i in self._zip.infolist() if not i.is_dir()]

    def read(self, name: str) -> bytes:
        return self._zip.read(name)


class _TarTree(_Tree):
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


def _is_archive(path: Path) -> bool:
    n = path.name.lower()
    return n.endswith((".zip", ".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tar.xz"))


def _open_archive(path: Path) -> _Tree:
    if path.name.lower().endswith(".zip"):
        return _ZipTree(path)
    return _TarTree(path)


# --------------------------------------------------------------------------------------------
# Decoders, one per layout. Each returns (train_x, train_y, test_x, test_y, classes, words).
# --------------------------------------------------------------------------------------------

_Decoded = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, list[str], list[str]]


def _slug(name: str) -> str:
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


def _decode_many(tree: _Tree, names: list[str], channels: int, size: int, where: str) -> np.ndarray:
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
        by_slug = {_slug(c): i for i, c in enumerate(info.classes)}
        mapping = {f: by_slug[_slug(f)] for f in folders if _slug(f) in by_slug}
        unknown = sorted(folders - set(mapping))
        missing = sorted(set(info.classes) - {info.classes[i] for i in mapping.values()})
        if len(set(mapping.values())) != len(mapping):
            raise DatasetFormatError(
                f"{where}: two class folders map to the same {info.title} class"
            )
        if unknown or missing:
            parts = []
            if unknown:
                parts.append(f"unknown class folders {_short(unknown)}")
            if missing:
                parts.append(f"missing class folders {_short(missing)}")
            raise DatasetFormatError(
                f"{where}: {' and '.join(parts)}; {info.title} class folders must be named "
                f"{_short(list(info.classes))}"
            )
        return mapping
    return {f: i for i, f in enumerate(sorted(folders))}


def _short(items: list[str], n: int = 6) -> str:
    shown = ", ".join(items[:n])
    return f"[{shown}{', ...' if len(items) > n else ''}] ({len(items)})"


def _decode_image_folder(tree: _Tree, info: DatasetInfo, where: str) -> _Decoded | None:
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


def _decode_cifar_python(tree: _Tree, info: DatasetInfo, where: str) -> _Decoded | None:
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
                f"{where}: class names in {meta_file} are {_short(names)}, "
                f"expected {info.title}'s {_short(list(info.classes))}"
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


def _decode_idx(tree: _Tree, info: DatasetInfo, where: str) -> _Decoded | None:
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


def _decode_tiny_imagenet(tree: _Tree, info: DatasetInfo, where: str) -> _Decoded | None:
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
        raise DatasetFormatError(f"{where}: no training images for classes {_short(missing)}")

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
        raise DatasetFormatError(f"{where}: val images without annotation {_short(unlabelled)}")

    out = []
    for rows in (sorted(train_rows), sorted(val_rows)):
        out.append(_decode_many(tree, [r[2] for r in rows], 3, info.image_size, where))
        out.append(np.array([r[0] for r in rows], dtype=np.int64))
    return out[0], out[1], out[2], out[3], classes, words


_DECODERS = {
    "cifar-python": _decode_cifar_python,
    "idx": _decode_idx,
    "tiny-imagenet": _decode_tiny_imagenet,
    "image-folder": _decode_image_folder,
}


# --------------------------------------------------------------------------------------------
# Finding a source
# --------------------------------------------------------------------------------------------


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
        return _Source(p, None) if _is_archive(p) else None
    if not p.is_dir():
        return None
    direct = _folder_format(p, info)
    if direct is not None:
        return direct
    for cand in info.candidates:
        q = p / cand
        if q.is_file() and _is_archive(q):
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


# --------------------------------------------------------------------------------------------
# Cache
# --------------------------------------------------------------------------------------------

_ARRAYS = ("train_images", "train_labels", "test_images", "test_labels")


def _cache_root(cache_dir: str | Path | None) -> Path:
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    env = os.environ.get("FEDTSP_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "fedtsp"


def _source_key(info: DatasetInfo, kind: str, path: Path, fingerprint: str) -> str:
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


def _read_cache(entry: Path) -> ImageDataset | None:
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


def _write_cache(entry: Path, ds: ImageDataset, extra: dict) -> None:
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


def _latest_cache_entry(root: Path, info: DatasetInfo) -> Path | None:
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


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _sha256_arrays(arrays: Iterable[np.ndarray]) -> str:
    h = hashlib.sha256()
    for a in arrays:
        h.update(np.ascontiguousarray(a).data)
    return h.hexdigest()


# --------------------------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------------------------


def _decode_source(src: _Source, info: DatasetInfo) -> ImageDataset:
    where = str(src.path)
    # A truncated or corrupt file shows up as any of these, while opening or decoding.
    damaged = (OSError, EOFError, tarfile.TarError, zipfile.BadZipFile, zlib.error, struct.error)
    try:
        if src.is_file:
            tree: _Tree = _open_archive(src.path)
            formats = info.formats
        else:
            tree = _DirTree(src.path, src.include)
            formats = (src.fmt,) if src.fmt else info.formats
        decoded = None
        for fmt in formats:
            decoded = _DECODERS[fmt](tree, info, where)
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
        checksum, checksum_of = _sha256_file(src.path), "archive"
    else:
        checksum, checksum_of = _sha256_arrays(arrays), "arrays"
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
        kind, fp = f"folder:{src.fmt}", _DirTree(path, src.include).fingerprint()
    key = _source_key(info, kind, path, fp)
    entry = root / f"{info.name}-{key[:20]}"
    cached = _read_cache(entry)
    if cached is not None:
        return cached
    ds = _decode_source(src, info)
    try:
        _write_cache(entry, ds, {"key": key, "kind": kind})
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
        if names and [_slug(n) for n in names] != [_slug(c) for c in info.classes]:
            raise DatasetFormatError(f"torchvision {info.torchvision} has classes {_short(names)}")
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
    root = _cache_root(cache_dir)
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
    env = os.environ.get("FEDTSP_DATA")
    if env:
        places.append(("FEDTSP_DATA", Path(env).expanduser()))
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
    entry = _latest_cache_entry(root, info) if root.is_dir() else None
    if entry is not None:
        cached = _read_cache(entry)
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
                checksum=_sha256_arrays(arrays),
                checksum_of="arrays",
            )
            key = _source_key(info, "torchvision", dl_root.resolve(), "")
            entry = root / f"{info.name}-{key[:20]}"
            # The download itself stays usable by torchvision if the cache cannot be written.
            with contextlib.suppress(OSError):
                _write_cache(entry, ds, {"key": key, "kind": "torchvision"})
            return ds

    raise DatasetNotFoundError(
        f"{info.title} ({info.name}) not found; looked in: {'; '.join(looked)}. "
        f"Provide it with --data PATH or the FEDTSP_DATA environment variable (the dataset's "
        f"archive or folder, or a folder containing one of {', '.join(info.candidates)}), "
        f"or allow a torchvision download with internet access; source: {info.how_to_get}."
    )

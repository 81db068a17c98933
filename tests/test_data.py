"""Dataset registry, loaders for every layout, cache behaviour and error messages."""

from __future__ import annotations

import gzip
import io
import pickle
import random
import shutil
import struct
import subprocess
import sys
import tarfile
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import fedtsp.data.decoders as decoders
import fedtsp.data.loading as loading
from fedtsp.data import (
    DATASETS,
    DatasetFormatError,
    DatasetNotFoundError,
    ImageDataset,
    dataset_info,
    dataset_names,
    load_dataset,
    normalize,
    semantic_groups,
)

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
CIFAR10 = list(DATASETS["cifar10"].classes)


@pytest.fixture(autouse=True)
def _no_env(monkeypatch: pytest.MonkeyPatch) -> None:
    # Tests must not see the user's data or cache settings.
    monkeypatch.delenv("FEDTSP_DATA", raising=False)
    monkeypatch.delenv("FEDTSP_CACHE", raising=False)


def _png(color: tuple[int, ...], size: int = 32, mode: str = "RGB", fmt: str = "PNG") -> bytes:
    buf = io.BytesIO()
    Image.new(mode, (size, size), color if mode != "L" else color[0]).save(buf, format=fmt)
    return buf.getvalue()


def _color(label: int, i: int) -> tuple[int, int, int]:
    return (label * 20, i * 10, 7)


def _make_folder_tar(path: Path, classes: list[str], top: str = "cifar10") -> None:
    """Tiny image-folder archive; members in shuffled order, pixel colour encodes (class, i)."""
    members = []
    for split, n in (("train", 3), ("test", 2)):
        for label, cls in enumerate(classes):
            for i in range(n):
                members.append((f"{top}/{split}/{cls}/{i:04d}.png", _png(_color(label, i))))
    random.Random(0).shuffle(members)
    with tarfile.open(path, "w:gz") as tf:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))


# ---------------------------------------------------------------------------------- registry


def test_registry_facts() -> None:
    assert dataset_names() == ["cifar10", "cifar100", "tinyimagenet", "fmnist"]
    assert CIFAR10 == [
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
    ]
    c100 = list(DATASETS["cifar100"].classes)
    assert len(c100) == len(set(c100)) == 100 and c100 == sorted(c100)
    assert c100[:3] == ["apple", "aquarium_fish", "baby"] and c100[-1] == "worm"
    assert "maple_tree" in c100
    fm = DATASETS["fmnist"]
    assert fm.classes[0] == "T-shirt/top" and fm.classes[9] == "Ankle boot"
    sizes = {n: (DATASETS[n].image_size, DATASETS[n].channels) for n in dataset_names()}
    assert sizes == {
        "cifar10": (32, 3),
        "cifar100": (32, 3),
        "tinyimagenet": (64, 3),
        "fmnist": (28, 1),
    }
    assert dataset_info("CIFAR-10").name == "cifar10"
    assert dataset_info("Fashion_MNIST").name == "fmnist"
    with pytest.raises(ValueError, match="unknown dataset 'mnist'"):
        dataset_info("mnist")


@pytest.mark.parametrize("name", ["cifar10", "cifar100", "fmnist"])
def test_semantic_groups_cover_every_class_once(name: str) -> None:
    groups = semantic_groups(name)
    members = [c for g in groups.values() for c in g]
    assert sorted(members) == sorted(DATASETS[name].classes)
    if name == "cifar100":
        assert len(groups) == 20 and all(len(g) == 5 for g in groups.values())
        assert groups["fish"] == ["aquarium_fish", "flatfish", "ray", "shark", "trout"]
    if name == "cifar10":
        assert groups["vehicles"] == ["airplane", "automobile", "ship", "truck"]


def test_semantic_groups_tiny_is_empty() -> None:
    assert semantic_groups("tinyimagenet") == {}


def test_normalize_matches_totensor_normalize() -> None:
    x = torch.randint(0, 256, (4, 3, 5, 5), dtype=torch.uint8)
    y = normalize(x)
    assert y.dtype == torch.float32
    # torchvision: ToTensor (x / 255) then Normalize((x - 0.5) / 0.5).
    ref = (x.float().div(255) - 0.5) / 0.5
    assert torch.equal(y, ref)
    assert normalize(torch.tensor([0, 255], dtype=torch.uint8)).tolist() == [-1.0, 1.0]
    with pytest.raises(TypeError):
        normalize(torch.zeros(2))


# ---------------------------------------------------------------------------- image folders


def test_image_folder_archive(tmp_path: Path) -> None:
    arc = tmp_path / "cifar10-jpg.tar.gz"
    _make_folder_tar(arc, CIFAR10)
    ds = load_dataset("cifar10", path=arc, cache_dir=tmp_path / "cache")
    assert ds.train_images.shape == (30, 3, 32, 32) and ds.train_images.dtype == np.uint8
    assert ds.test_images.shape == (20, 3, 32, 32)
    assert ds.train_labels.dtype == np.int64
    # Sorted by (class, file name) whatever the archive order.
    assert ds.train_labels.tolist() == [k for k in range(10) for _ in range(3)]
    for j, (label, i) in enumerate((k, i) for k in range(10) for i in range(3)):
        assert tuple(ds.train_images[j, :, 0, 0]) == _color(label, i)
    assert ds.checksum_of == "archive" and len(ds.checksum) == 64
    assert ds.num_classes == 10 and ds.image_size == 32 and ds.channels == 3
    # A folder containing the archive under its well-known name works too.
    again = load_dataset("cifar10", path=tmp_path, cache_dir=tmp_path / "cache")
    assert np.array_equal(again.train_images, ds.train_images)


def test_image_folder_unknown_and_missing_classes(tmp_path: Path) -> None:
    bad = CIFAR10[:-1] + ["zebra"]
    arc = tmp_path / "bad.tar.gz"
    _make_folder_tar(arc, bad)
    with pytest.raises(
        DatasetFormatError, match=r"unknown class folders \[zebra\].*missing.*truck"
    ):
        load_dataset("cifar10", path=arc, cache_dir=tmp_path / "cache")


def test_image_folder_wrong_image_size(tmp_path: Path) -> None:
    root = tmp_path / "data"
    for split in ("train", "test"):
        for k, c in enumerate(CIFAR10):
            (root / split / c).mkdir(parents=True)
            (root / split / c / "a.jpg").write_bytes(_png(_color(k, 0), size=16, fmt="JPEG"))
    with pytest.raises(DatasetFormatError, match="16x16, expected 32x32"):
        load_dataset("cifar10", path=root, cache_dir=tmp_path / "cache")


def test_fmnist_image_folder_slug_names(tmp_path: Path) -> None:
    root = tmp_path / "fm"
    for split in ("train", "test"):
        for k, c in enumerate(DATASETS["fmnist"].classes):
            folder = root / split / c.replace("/", "_").replace(" ", "_").lower()
            folder.mkdir(parents=True)
            (folder / "0.png").write_bytes(_png((k * 10,), size=28, mode="L"))
    ds = load_dataset("fmnist", path=root, cache_dir=tmp_path / "cache")
    assert ds.train_images.shape == (10, 1, 28, 28)
    assert ds.train_images[:, 0, 0, 0].tolist() == [k * 10 for k in range(10)]
    assert ds.checksum_of == "arrays"


# ----------------------------------------------------------------------------- Tiny-ImageNet

TINY_WNIDS = ["n03", "n01", "n02"]  # wnids.txt order; labels follow the sorted order
TINY_VAL = [("val_0.JPEG", "n03"), ("val_1.JPEG", "n01"), ("val_2.JPEG", "n02")]
TINY_VAL += [("val_3.JPEG", "n01"), ("val_4.JPEG", "n03"), ("val_5.JPEG", "n02")]


def _tiny_color(wnid: str) -> int:
    return {"n01": 40, "n02": 120, "n03": 200}[wnid]


def _make_tiny(root: Path) -> Path:
    top = root / "tiny-imagenet-200"
    (top / "val" / "images").mkdir(parents=True)
    (top / "wnids.txt").write_text("\n".join(TINY_WNIDS) + "\n")
    words = "n00\tentity\nn01\tgoldfish, Carassius auratus\nn02\tbullfrog\nn03\ttabby, tabby cat\n"
    (top / "words.txt").write_text(words)
    for w in TINY_WNIDS:
        (top / "train" / w / "images").mkdir(parents=True)
        (top / "train" / w / f"{w}_boxes.txt").write_text("")
        for i in range(2):
            v = _tiny_color(w)
            jpg = _png((v, v, v), size=64, fmt="JPEG")
            (top / "train" / w / "images" / f"{w}_{i}.JPEG").write_bytes(jpg)
    lines = []
    for j, (fname, w) in enumerate(TINY_VAL):
        v = _tiny_color(w)
        # One grayscale file, as Tiny-ImageNet has some: must come out as RGB.
        mode = "L" if j == 2 else "RGB"
        (top / "val" / "images" / fname).write_bytes(_png((v, v, v), 64, mode, "JPEG"))
        lines.append(f"{fname}\t{w}\t0\t0\t63\t63")
    (top / "val" / "val_annotations.txt").write_text("\n".join(lines) + "\n")
    # The unlabelled official test images must be ignored.
    (top / "test" / "images").mkdir(parents=True)
    (top / "test" / "images" / "test_0.JPEG").write_bytes(_png((1, 1, 1), 64, "RGB", "JPEG"))
    return top


def _check_tiny(ds: ImageDataset) -> None:
    assert ds.classes == ["n01", "n02", "n03"]
    assert ds.class_words == ["goldfish, Carassius auratus", "bullfrog", "tabby, tabby cat"]
    assert ds.train_images.shape == (6, 3, 64, 64) and ds.test_images.shape == (6, 3, 64, 64)
    assert ds.train_labels.tolist() == [0, 0, 1, 1, 2, 2]
    # Each val image's brightness encodes its annotated class: labels must agree with it.
    true = {40: 0, 120: 1, 200: 2}
    for img, label in zip(ds.test_images, ds.test_labels, strict=True):
        value = int(round(float(img.mean())))
        nearest = min(true, key=lambda v: abs(v - value))
        assert abs(nearest - value) <= 3 and true[nearest] == label
    assert sorted(ds.test_labels.tolist()) == [0, 0, 1, 1, 2, 2]


def test_tiny_imagenet_folder_uses_val_annotations(tmp_path: Path) -> None:
    top = _make_tiny(tmp_path)
    ds = load_dataset("tinyimagenet", path=top, cache_dir=tmp_path / "cache")
    _check_tiny(ds)


def test_tiny_imagenet_zip_and_env_lookup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    top = _make_tiny(tmp_path / "src")
    data = tmp_path / "data"
    data.mkdir()
    with zipfile.ZipFile(data / "tiny-imagenet-200.zip", "w") as zf:
        for f in sorted(top.rglob("*")):
            if f.is_file():
                zf.write(f, f.relative_to(top.parent).as_posix())
    monkeypatch.setenv("FEDTSP_DATA", str(data))
    ds = load_dataset("tinyimagenet", cache_dir=tmp_path / "cache", download=False)
    _check_tiny(ds)
    assert ds.checksum_of == "archive" and ds.source.endswith("tiny-imagenet-200.zip")


def test_tiny_imagenet_missing_val_image(tmp_path: Path) -> None:
    top = _make_tiny(tmp_path)
    (top / "val" / "images" / "val_4.JPEG").unlink()
    with pytest.raises(DatasetFormatError, match="val_4.JPEG is missing"):
        load_dataset("tinyimagenet", path=top, cache_dir=tmp_path / "cache")


# ------------------------------------------------------------------ CIFAR python, IDX layouts


def _cifar10_python(root: Path) -> tuple[np.ndarray, np.ndarray]:
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    xs, ys = [], []
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        x = rng.integers(0, 256, (2, 3072), dtype=np.uint8)
        y = rng.integers(0, 10, 2).tolist()
        batch = {b"batch_label": name.encode(), b"data": x, b"labels": y}
        (folder / name).write_bytes(pickle.dumps(batch, protocol=2))
        xs.append(x.reshape(-1, 3, 32, 32))
        ys.append(y)
    meta = {b"label_names": [c.encode() for c in CIFAR10], b"num_vis": 3072}
    (folder / "batches.meta").write_bytes(pickle.dumps(meta, protocol=2))
    return np.concatenate(xs), np.concatenate(ys)


def test_cifar_python_folder_and_tarball(tmp_path: Path) -> None:
    x, y = _cifar10_python(tmp_path / "src")
    ds = load_dataset("cifar10", path=tmp_path / "src", cache_dir=tmp_path / "cache")
    assert np.array_equal(ds.train_images, x[:10]) and np.array_equal(ds.test_images, x[10:])
    assert ds.train_labels.tolist() == y[:10].tolist() and ds.checksum_of == "arrays"
    arc = tmp_path / "cifar-10-python.tar.gz"
    with tarfile.open(arc, "w:gz") as tf:
        tf.add(tmp_path / "src" / "cifar-10-batches-py", arcname="cifar-10-batches-py")
    ds2 = load_dataset("cifar10", path=arc, cache_dir=tmp_path / "cache")
    assert np.array_equal(ds2.train_images, ds.train_images) and ds2.checksum_of == "archive"


def test_cifar_python_refuses_foreign_pickles(tmp_path: Path) -> None:
    _cifar10_python(tmp_path)
    # A pickle that would call a function on load must be rejected, not executed.
    evil = pickle.dumps({b"data": shutil.rmtree, b"labels": []}, protocol=2)
    (tmp_path / "cifar-10-batches-py" / "test_batch").write_bytes(evil)
    with pytest.raises(DatasetFormatError, match="refusing to load shutil.rmtree"):
        load_dataset("cifar10", path=tmp_path, cache_dir=tmp_path / "cache")


def _idx(arr: np.ndarray) -> bytes:
    header = bytes([0, 0, 0x08, arr.ndim]) + struct.pack(f">{arr.ndim}I", *arr.shape)
    return gzip.compress(header + arr.astype(np.uint8).tobytes())


def test_fmnist_idx_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "data" / "fashion-mnist"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(1)
    arrays = {
        "train-images-idx3-ubyte.gz": rng.integers(0, 256, (7, 28, 28)),
        "train-labels-idx1-ubyte.gz": rng.integers(0, 10, 7),
        "t10k-images-idx3-ubyte.gz": rng.integers(0, 256, (3, 28, 28)),
        "t10k-labels-idx1-ubyte.gz": rng.integers(0, 10, 3),
    }
    for name, a in arrays.items():
        (folder / name).write_bytes(_idx(a))
    # Found through FEDTSP_DATA pointing at a folder that contains fashion-mnist/.
    monkeypatch.setenv("FEDTSP_DATA", str(tmp_path / "data"))
    ds = load_dataset("fmnist", cache_dir=tmp_path / "cache", download=False)
    assert ds.train_images.shape == (7, 1, 28, 28) and ds.test_images.shape == (3, 1, 28, 28)
    assert np.array_equal(ds.train_images[:, 0], arrays["train-images-idx3-ubyte.gz"])
    assert ds.test_labels.tolist() == arrays["t10k-labels-idx1-ubyte.gz"].tolist()


# ------------------------------------------------------------------------------------- cache


def test_cache_skips_decoding_and_is_keyed_by_source(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    arc = tmp_path / "c10.tar.gz"
    _make_folder_tar(arc, CIFAR10)
    cache = tmp_path / "cache"
    calls: list[int] = []
    real = decoders._decode_many  # every image file is decoded through it

    def counting(tree: object, names: list[str], *args: object) -> np.ndarray:
        calls.append(len(names))
        return real(tree, names, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(decoders, "_decode_many", counting)
    first = load_dataset("cifar10", path=arc, cache_dir=cache)
    assert sum(calls) == 50
    assert len(list(cache.glob("cifar10-*/train_images.npy"))) == 1
    assert not list(cache.glob(".*tmp*")), "no temporary folder may be left behind"

    def fail(*args: object) -> np.ndarray:
        raise AssertionError("decoded again although cached")

    monkeypatch.setattr(decoders, "_decode_many", fail)
    second = load_dataset("cifar10", path=arc, cache_dir=cache)
    for k in ("train_images", "train_labels", "test_images", "test_labels"):
        assert np.array_equal(getattr(first, k), getattr(second, k))
    assert second.checksum == first.checksum and second.source == first.source

    # With no source given, the cached copy is used (step 2 of the search).
    third = load_dataset("cifar10", cache_dir=cache, download=False)
    assert np.array_equal(third.train_images, first.train_images)

    # A different source (another archive) is not confused with the cached one.
    monkeypatch.setattr(decoders, "_decode_many", counting)
    other = tmp_path / "other.tar.gz"
    shutil.copy(arc, other)
    load_dataset("cifar10", path=other, cache_dir=cache)
    assert sum(calls) == 100
    assert len(list(cache.glob("cifar10-*/meta.json"))) == 2


# ------------------------------------------------------------------------------ not found


def test_not_found_message_names_everything(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.setenv("FEDTSP_DATA", str(empty))
    cache = tmp_path / "cache"
    with pytest.raises(DatasetNotFoundError) as err:
        load_dataset("cifar100", cache_dir=cache, download=False)
    msg = str(err.value)
    assert isinstance(err.value, FileNotFoundError)
    for part in ("CIFAR-100", "cifar100", str(empty), str(cache), "download=False", "--data"):
        assert part in msg, part
    assert "FEDTSP_DATA" in msg and "cifar-100-python" in msg


def test_download_failure_is_wrapped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def offline(info: object, root: Path) -> tuple[np.ndarray, ...]:
        raise OSError("no route to host")

    monkeypatch.setattr(loading, "_download_torchvision", offline)
    with pytest.raises(DatasetNotFoundError, match="failed: no route to host"):
        load_dataset("cifar10", cache_dir=tmp_path / "cache", download=True)


def test_tiny_has_no_download_and_bad_explicit_path(tmp_path: Path) -> None:
    with pytest.raises(DatasetNotFoundError, match="torchvision has no Tiny-ImageNet"):
        load_dataset("tinyimagenet", cache_dir=tmp_path / "cache")
    missing = tmp_path / "nope"
    with pytest.raises(DatasetNotFoundError, match=f"{missing} does not exist"):
        load_dataset("cifar10", path=missing, cache_dir=tmp_path / "cache")


# ---------------------------------------------------------------------------- real archives


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "archive", "per_class"),
    [("cifar10", "cifar10-jpg.tar.gz", 5000), ("cifar100", "cifar100-jpg.tar.gz", 500)],
)
def test_real_cifar_archive(
    name: str, archive: str, per_class: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = SHARED_DATA / archive
    if not path.is_file():
        pytest.skip(f"{path} not found")
    t0 = time.perf_counter()
    ds = load_dataset(name, path=path, cache_dir=tmp_path)
    t1 = time.perf_counter()
    again = load_dataset(name, path=path, cache_dir=tmp_path)
    t2 = time.perf_counter()
    with capsys.disabled():
        print(f"\n{archive}: first decode {t1 - t0:.1f} s, cached load {t2 - t1:.2f} s")
    assert ds.train_images.shape == (50000, 3, 32, 32)
    assert ds.test_images.shape == (10000, 3, 32, 32)
    assert np.bincount(ds.train_labels).tolist() == [per_class] * ds.num_classes
    assert np.bincount(ds.test_labels).tolist() == [per_class // 5] * ds.num_classes
    assert (
        ds.checksum
        == {
            "cifar10": "2be44c9b74e3a0e212bbf7130cc0239c31e5343b4994679eea9e88caee288ec6",
            "cifar100": "71d6e7e11831d7947e53e1571a74dd244f5f5672bc98f9440af227b545b934b8",
        }[name]
    )
    assert np.array_equal(again.train_images, ds.train_images)
    assert np.array_equal(again.test_labels, ds.test_labels)
    # Real pictures, not blanks: per-channel means in a plausible range.
    means = ds.train_images[:2000].mean(axis=(0, 2, 3))
    assert np.all((means > 80) & (means < 180))


def test_real_fmnist_debian_package(tmp_path: Path) -> None:
    folder = Path("/usr/share/datasets/fashion-mnist")
    if not folder.is_dir():
        pytest.skip(f"{folder} not found (Debian package dataset-fashion-mnist)")
    # Found in its default place with no path and no FEDTSP_DATA.
    ds = load_dataset("fmnist", cache_dir=tmp_path, download=False)
    assert ds.source == str(folder)
    assert ds.train_images.shape == (60000, 1, 28, 28) and ds.test_images.shape == (
        10000,
        1,
        28,
        28,
    )
    assert np.bincount(ds.train_labels).tolist() == [6000] * 10
    assert np.bincount(ds.test_labels).tolist() == [1000] * 10


def test_the_data_package_loads_its_registry_at_once_and_the_rest_on_use():
    script = (
        "import sys, fedtsp.data as d; d.dataset_names(); assert 'torch' not in sys.modules; "
        "missing = [n for n in d.__all__ if getattr(d, n, None) is None]; "
        "print(sorted(missing), 'torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert out.stdout.strip() == "[] True", out.stderr  # every exported name resolves

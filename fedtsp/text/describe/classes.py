"""The class list a description file covers: the registry's, or Tiny-ImageNet's wnids and words."""

from __future__ import annotations

import json
import logging
import zipfile
from pathlib import Path

from fedtsp.data import dataset_info
from fedtsp.text.describe.errors import DescribeInputError
from fedtsp.text.describe.prompts import VARIANTS, ClassSpec
from fedtsp.text.descriptions import DESCRIPTION_SETS_DIR

log = logging.getLogger(__name__)

# Committed description sets; Tiny-ImageNet's class list (wnids) falls back to theirs.
COMMITTED_SETS = DESCRIPTION_SETS_DIR


def _readable(name: str) -> str:
    return " ".join(name.replace("_", " ").split())


def _read_named(path: Path, filename: str) -> tuple[str, Path | None]:
    """Text of `filename` given as that file, a folder holding it, or a .zip archive.

    Returns the text and the folder it was found in (None for archives and plain files).
    """
    if path.is_dir():
        for where in (path, *sorted(p for p in path.iterdir() if p.is_dir())):
            if (where / filename).is_file():
                return (where / filename).read_text(encoding="utf-8", errors="replace"), where
        raise DescribeInputError(f"{path} holds no {filename}")
    if zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as zf:
            names = [n for n in zf.namelist() if n.rsplit("/", 1)[-1] == filename]
            if not names:
                raise DescribeInputError(f"{path} holds no {filename}")
            return zf.read(min(names, key=len)).decode("utf-8", "replace"), None
    return path.read_text(encoding="utf-8", errors="replace"), None


def _read_words(text: str, where: str) -> dict[str, str]:
    words: dict[str, str] = {}
    for i, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        wnid, sep, name = line.partition("\t")
        if not sep or not wnid.strip() or not name.strip():
            raise DescribeInputError(f"{where} line {i} is not 'wnid<TAB>words': {line!r}")
        words[wnid.strip()] = name.strip()
    return words


def _committed_keys(dataset: str, num_classes: int) -> list[str] | None:
    """The sorted class keys of a committed description set of `dataset`, if one has them all."""
    for variant in VARIANTS:
        path = COMMITTED_SETS / f"{dataset}_{variant}.json"
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError):
            continue
        keys = sorted(key for key in data if not key.startswith("_"))
        if len(keys) == num_classes:
            return keys
    return None


def resolve_classes(
    dataset: str, wnids: str | Path | None = None, class_words: str | Path | None = None
) -> tuple[str, str, list[ClassSpec]]:
    """(canonical dataset name, title, classes) in label order.

    Tiny-ImageNet's classes come from its data: `wnids` is its wnids.txt (the file, the dataset
    folder or the .zip); `class_words` its words.txt (``wnid<TAB>words``), looked for next to
    wnids.txt when not given. Without words the model is told the bare WordNet ids (warning).
    Without wnids.txt the class list comes from a words file listing exactly the dataset's
    classes, else from the committed description set (`COMMITTED_SETS`), else it is an error.
    """

    try:
        info = dataset_info(dataset)
    except ValueError as err:
        raise DescribeInputError(str(err)) from None
    if info.classes:
        if wnids is not None or class_words is not None:
            raise DescribeInputError(
                f"--wnids/--class-words only apply to Tiny-ImageNet, not {info.title}"
            )
        return info.name, info.title, [ClassSpec(c, _readable(c)) for c in info.classes]

    words: dict[str, str] | None = None
    keys: list[str] | None = None
    if wnids is not None:
        wpath = Path(wnids).expanduser()
        if not wpath.exists():
            raise DescribeInputError(f"wnids file {wpath} does not exist")
        text, folder = _read_named(wpath, "wnids.txt")
        listed = [w.strip() for w in text.splitlines() if w.strip()]
        if len(set(listed)) != len(listed):
            raise DescribeInputError(f"{wpath} lists a class twice")
        keys = sorted(listed)  # the loader sorts wnids like torchvision's ImageFolder
        if class_words is None:
            if folder is not None and (folder / "words.txt").is_file():
                class_words = folder / "words.txt"
            elif zipfile.is_zipfile(wpath):
                try:
                    words = _read_words(_read_named(wpath, "words.txt")[0], str(wpath))
                except DescribeInputError:
                    words = None
    if class_words is not None:
        cpath = Path(class_words).expanduser()
        if not cpath.exists():
            raise DescribeInputError(f"class words file {cpath} does not exist")
        words = _read_words(_read_named(cpath, "words.txt")[0], str(cpath))
    if keys is None and words is not None and len(words) == info.num_classes:
        keys = sorted(words)  # a words file listing exactly the dataset's classes
    if keys is None:
        keys = _committed_keys(info.name, info.num_classes)
        if keys is None:
            raise DescribeInputError(
                f"{info.title}'s classes come from its data: pass --wnids (its wnids.txt, "
                "folder or .zip), and --class-words words.txt for readable names"
            )
        log.info("%s class list (wnids) taken from the committed description sets", info.title)
    if len(keys) != info.num_classes:
        raise DescribeInputError(
            f"the wnids list holds {len(keys)} classes, {info.title} has {info.num_classes}"
        )
    if words is None:
        log.warning(
            "no class words for %s: the model is told bare WordNet ids (e.g. %s), which it may "
            "not recognise; pass --class-words words.txt",
            info.title,
            keys[0],
        )
        words = {}
    unnamed = [w for w in keys if w not in words]
    if words and unnamed:
        log.warning("%d wnids have no entry in the class words; their ids are used", len(unnamed))
    return info.name, info.title, [ClassSpec(w, words.get(w, w)) for w in keys]

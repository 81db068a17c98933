"""Class semantics for Fig. 1: WordNet similarity of class names and prototype-similarity metrics.

WordNet (Princeton WordNet 3.0, read through nltk) is found in this order by `wordnet()`:

1. an nltk ``wordnet`` corpus already on ``nltk.data.path`` (what
   ``python -c "import nltk; nltk.download('wordnet')"`` installs);
2. the WordNet 3.0 database files of the Debian/Ubuntu packages ``wordnet-base`` and
   ``wordnet-sense-index`` (``/usr/share/wordnet``, or ``$WNSEARCHDIR``), copied once into
   ``<cache>/nltk_data/corpora/wordnet`` (cache: ``$FEDTSP_CACHE``, else ``~/.cache/fedtsp``)
   together with the ``lexnames`` table nltk needs; nltk only reads regular files under a
   folder on ``nltk.data.path``, hence the copy (symlinks into ``/usr/share`` are refused).

Class names map to noun synsets through the committed table ``fedtsp/paper/class_synsets.json``
(CIFAR-10, CIFAR-100, Fashion-MNIST; its ``_notes`` give the choice rule and the hard cases);
Tiny-ImageNet class names are WordNet ids (``n01443537``) and map to their synsets directly.

Metrics (PROTOCOL "Semantic metrics"): `prototype_similarity` (cosine between class
prototypes), `semantic_alignment` (Spearman rho between two similarity matrices over the
class pairs i < j) and `semantic_gap` (mean within-group minus mean across-group similarity).
"""

from __future__ import annotations

import contextlib
import functools
import json
import re
import shutil
import uuid
import warnings
from collections.abc import Mapping, Sequence
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from fedtsp.core.environment import cache_root, wordnet_dir
from fedtsp.core.errors import UserError
from fedtsp.data import dataset_info, semantic_groups

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure
    from nltk.corpus.reader.wordnet import Synset, WordNetCorpusReader

__all__ = [
    "DEBIAN_WORDNET_DIR",
    "LEXNAMES",
    "MEASURES",
    "WORDNET_VERSION",
    "WordNetUnavailableError",
    "build_wordnet_folder",
    "class_synsets",
    "group_ids",
    "plot_similarity_heatmap",
    "prototype_similarity",
    "semantic_alignment",
    "semantic_gap",
    "similarity_matrix",
    "synset_mapping",
    "synset_of",
    "untrained_text_semantics",
    "untrained_text_table",
    "wordnet",
    "wordnet_similarity",
]

WORDNET_VERSION = "3.0"
DEBIAN_WORDNET_DIR = Path("/usr/share/wordnet")
MEASURES = ("wup", "path", "lch")

INSTALL_HINT = (
    "Install WordNet 3.0 with `apt-get install wordnet-base wordnet-sense-index` "
    "(Debian/Ubuntu; files in /usr/share/wordnet) or "
    "`python -c \"import nltk; nltk.download('wordnet')\"`."
)

# WordNet 3.0's 45 lexicographer files in file-number order (lexnames(5WN)). nltk needs this
# table next to the database; the Debian packages do not ship it.
LEXNAMES: tuple[str, ...] = (
    "adj.all", "adj.pert", "adv.all", "noun.Tops", "noun.act", "noun.animal",
    "noun.artifact", "noun.attribute", "noun.body", "noun.cognition", "noun.communication",
    "noun.event", "noun.feeling", "noun.food", "noun.group", "noun.location", "noun.motive",
    "noun.object", "noun.person", "noun.phenomenon", "noun.plant", "noun.possession",
    "noun.process", "noun.quantity", "noun.relation", "noun.shape", "noun.state",
    "noun.substance", "noun.time", "verb.body", "verb.change", "verb.cognition",
    "verb.communication", "verb.competition", "verb.consumption", "verb.contact",
    "verb.creation", "verb.emotion", "verb.motion", "verb.perception", "verb.possession",
    "verb.social", "verb.stative", "verb.weather", "adj.ppl",
)  # fmt: skip
_CATEGORY = {"noun": 1, "verb": 2, "adj": 3, "adv": 4}

_POS_SUFFIXES = ("noun", "verb", "adj", "adv")
# What nltk's reader opens: the index and exception lists at start-up, the data files on use.
_REQUIRED_FILES = tuple(
    f"{kind}.{pos}" for kind in ("index", "data") for pos in _POS_SUFFIXES
) + tuple(f"{pos}.exc" for pos in _POS_SUFFIXES)
# Only needed for sense keys (index.sense, from wordnet-sense-index) and lemma counts.
_OPTIONAL_FILES = ("index.sense", "cntlist.rev", "cntlist")
_MARKER = "fedtsp-wordnet.json"

_WNID = re.compile(r"^n\d{8}$")


class WordNetUnavailableError(UserError, LookupError):
    """No usable WordNet 3.0 database was found (the message says how to install one)."""


# --------------------------------------------------------------------------------------------
# WordNet access
# --------------------------------------------------------------------------------------------


def _lexnames_text() -> str:
    return "".join(
        f"{i:02d}\t{name}\t{_CATEGORY[name.split('.')[0]]}\n" for i, name in enumerate(LEXNAMES)
    )


def _is_complete(folder: Path) -> bool:
    return (folder / _MARKER).is_file() and all(
        (folder / name).is_file() for name in (*_REQUIRED_FILES, "lexnames")
    )


def build_wordnet_folder(
    source: str | Path = DEBIAN_WORDNET_DIR, cache_dir: str | Path | None = None
) -> Path:
    """Copy a WordNet 3.0 database folder into an nltk data folder; return that data folder.

    ``source`` holds the database files (``index.noun``, ``data.noun``, ``noun.exc``, ...),
    e.g. ``/usr/share/wordnet``. The result is ``<cache>/nltk_data`` with the files under
    ``corpora/wordnet`` plus a written ``lexnames``. An existing complete copy is reused
    (whatever its source: WordNet 3.0 does not change), even if ``source`` is gone. The
    folder is assembled under a temporary name and renamed into place, so a concurrent or
    interrupted build never leaves a half-copied corpus behind.
    """
    data_dir = cache_root(cache_dir) / "nltk_data"
    corpora = data_dir / "corpora"
    final = corpora / "wordnet"
    if _is_complete(final):
        return data_dir
    source = Path(source).expanduser()
    missing = [name for name in _REQUIRED_FILES if not (source / name).is_file()]
    if missing:
        what = "no files" if len(missing) == len(_REQUIRED_FILES) else ", ".join(missing)
        raise WordNetUnavailableError(
            f"no WordNet database in {source} (missing {what}). {INSTALL_HINT}"
        )

    corpora.mkdir(parents=True, exist_ok=True)
    tmp = corpora / f".wordnet-{uuid.uuid4().hex}"
    tmp.mkdir()
    try:
        # copyfile follows links and writes regular files, which nltk's path checks require.
        for name in _REQUIRED_FILES + _OPTIONAL_FILES:
            if (source / name).is_file():
                shutil.copyfile(source / name, tmp / name)
        (tmp / "lexnames").write_text(_lexnames_text())
        (tmp / _MARKER).write_text(
            json.dumps({"source": str(source.resolve()), "version": WORDNET_VERSION}) + "\n"
        )
        if final.exists() and not _is_complete(final):
            # A foreign or partial folder (not ours: ours appear whole): move it out of the way.
            stale = corpora / f".wordnet-stale-{uuid.uuid4().hex}"
            with contextlib.suppress(OSError):
                final.rename(stale)
                shutil.rmtree(stale, ignore_errors=True)
        try:
            tmp.rename(final)
        except OSError:
            # Another process finished first; its copy is as good as ours.
            if not _is_complete(final):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return data_dir


def _reader(data_dir: Path | str | None) -> WordNetCorpusReader:
    """nltk's reader for ``<data_dir>/corpora/wordnet`` (None: search ``nltk.data.path``)."""
    import nltk
    from nltk.corpus.reader.wordnet import WordNetCorpusReader

    if data_dir is not None:
        # Recent nltk releases (pathsec) refuse files outside the folders on nltk.data.path.
        if str(data_dir) not in nltk.data.path:
            nltk.data.path.append(str(data_dir))
        pointer = nltk.data.find("corpora/wordnet", paths=[str(data_dir)])
    else:
        pointer = nltk.data.find("corpora/wordnet")
    # No Open Multilingual Wordnet: only English synsets are used, so nltk's warning is noise.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The multilingual functions")
        return WordNetCorpusReader(pointer, None)


@functools.lru_cache(maxsize=8)
def _wordnet_cached(source: str | None, cache_dir: str | None) -> WordNetCorpusReader:
    problems: list[str] = []
    other_version: WordNetCorpusReader | None = None
    if source is None:
        try:
            reader = _reader(None)
            version = reader.get_version()
        except LookupError:
            problems.append("no nltk 'wordnet' corpus on nltk.data.path")
        except (OSError, ValueError) as err:
            problems.append(f"nltk 'wordnet' corpus unreadable: {err}")
        else:
            if version == WORDNET_VERSION:
                return reader
            other_version = reader
            problems.append(f"nltk 'wordnet' corpus is WordNet {version}")
        env = wordnet_dir()
        sources = [env] if env is not None else []
        sources.append(DEBIAN_WORDNET_DIR)
    else:
        sources = [Path(source)]
    for folder in sources:
        try:
            return _reader(build_wordnet_folder(folder, cache_dir))
        except WordNetUnavailableError:
            problems.append(f"no WordNet database in {folder}")
        except (LookupError, OSError, ValueError) as err:
            problems.append(f"{folder}: {str(err).splitlines()[0]}")
    if other_version is not None:
        # Better than nothing, but the committed synset names were chosen in WordNet 3.0.
        warnings.warn(
            f"using WordNet {other_version.get_version()} from nltk; the class-synset table "
            f"was checked against WordNet {WORDNET_VERSION}",
            RuntimeWarning,
            stacklevel=3,
        )
        return other_version
    raise WordNetUnavailableError(
        "WordNet 3.0 not found (" + "; ".join(problems) + "). " + INSTALL_HINT
    )


def wordnet(
    source: str | Path | None = None, cache_dir: str | Path | None = None
) -> WordNetCorpusReader:
    """The WordNet 3.0 reader (nltk ``WordNetCorpusReader``), cached per process.

    With ``source`` (a WordNet database folder such as ``/usr/share/wordnet``) only that folder
    is used; otherwise an installed nltk corpus, then ``$WNSEARCHDIR``, then the Debian files.
    Raises `WordNetUnavailableError` with installation instructions when none is usable.
    """
    return _wordnet_cached(
        None if source is None else str(Path(source).expanduser()),
        None if cache_dir is None else str(Path(cache_dir).expanduser()),
    )


# --------------------------------------------------------------------------------------------
# Class names -> synsets
# --------------------------------------------------------------------------------------------


def _key(name: str) -> str:
    # Same normalisation as the data loader's class folders ("T-shirt/top" -> "t_shirt_top").
    return re.sub(r"[^a-z0-9]+", "_", str(name).lower()).strip("_")


@functools.lru_cache(maxsize=1)
def _synset_table() -> dict[str, dict[str, str]]:
    text = (
        resources.files("fedtsp.paper").joinpath("class_synsets.json").read_text(encoding="utf-8")
    )
    return {k: v for k, v in json.loads(text).items() if not k.startswith("_")}


def synset_mapping(dataset: str) -> dict[str, str]:
    """The committed class-name -> synset-name table of a dataset (empty for Tiny-ImageNet)."""
    info = dataset_info(dataset)
    return dict(_synset_table().get(info.name, {}))


def synset_of(wnid: str, wn: WordNetCorpusReader | None = None) -> Synset:
    """The noun synset of a WordNet id such as ``n02084071`` (Tiny-ImageNet's class names)."""
    if not _WNID.match(str(wnid)):
        raise ValueError(f"{wnid!r} is not a WordNet noun id (expected 'n' + 8 digits)")
    wn = wn or wordnet()
    try:
        return wn.synset_from_pos_and_offset("n", int(wnid[1:]))
    except Exception as err:  # nltk raises a bare WordNetError/ValueError for bad offsets
        raise ValueError(f"no WordNet {WORDNET_VERSION} noun synset with id {wnid}") from err


def _class_names(dataset: str, class_names: Sequence[str] | None) -> list[str]:
    if class_names is not None:
        names = [str(c) for c in class_names]
    else:
        info = dataset_info(dataset)
        if not info.classes:
            raise ValueError(
                f"{info.title} has no fixed class list; pass class_names (its WordNet ids)"
            )
        names = list(info.classes)
    if len(names) < 2:
        raise ValueError(f"need at least 2 classes, got {len(names)}")
    return names


def class_synsets(
    dataset: str,
    class_names: Sequence[str] | None = None,
    *,
    mapping: Mapping[str, str] | None = None,
    wn: WordNetCorpusReader | None = None,
) -> list[Synset]:
    """Noun synsets of a dataset's classes, in ``class_names`` order (default: all classes).

    Names are looked up in ``mapping`` (if given), then in the committed table; a name that is
    itself a WordNet id (``n02084071``) maps to its synset. Values may be synset names
    (``dog.n.01``) or WordNet ids.
    """
    info = dataset_info(dataset)
    names = _class_names(info.name, class_names)
    table = {_key(k): v for k, v in synset_mapping(info.name).items()}
    if mapping:
        table.update({_key(k): v for k, v in mapping.items()})
    wn = wn or wordnet()
    synsets: list[Synset] = []
    unknown: list[str] = []
    for name in names:
        target = table.get(_key(name), name if _WNID.match(name) else None)
        if target is None:
            unknown.append(name)
            continue
        if _WNID.match(target):
            synset = synset_of(target, wn)
        else:
            try:
                synset = wn.synset(target)
            except Exception as err:  # nltk's WordNetError for a name it does not know
                raise ValueError(f"class {name!r}: no WordNet synset {target!r}") from err
        if synset.pos() != "n":
            raise ValueError(f"class {name!r}: {synset.name()} is not a noun synset")
        synsets.append(synset)
    if unknown:
        raise ValueError(
            f"no synset for {info.title} class(es) {', '.join(map(repr, unknown))}; "
            "pass mapping={class_name: 'synset.n.01'}"
        )
    return synsets


# --------------------------------------------------------------------------------------------
# Similarity matrices
# --------------------------------------------------------------------------------------------


def similarity_matrix(synsets: Sequence[Synset], measure: str = "wup") -> np.ndarray:
    """(C, C) WordNet similarity of synsets: ``wup`` (Wu-Palmer), ``path`` or ``lch``.

    Pairs use nltk's implementations. ``lch`` is Leacock-Chodorow,
    -log((path length + 1) / (2 * taxonomy depth)), so it is not in [0, 1] (and nltk's first
    ``lch`` call scans the whole noun taxonomy once, about 10 s). The matrix is symmetric
    (upper triangle mirrored). The diagonal is the measure's value for identical concepts: 1
    for ``wup`` and ``path``, -log(1 / (2 * depth)) for ``lch``. (nltk's own
    ``s.wup_similarity(s)`` is below 1 for synsets whose hypernym paths differ in depth, e.g.
    0.909 for apple.n.01, because it takes the common hypernym of greatest minimum depth.)
    """
    if measure not in MEASURES:
        raise ValueError(f"unknown WordNet measure {measure!r}; choose one of {MEASURES}")
    method = {"wup": "wup_similarity", "path": "path_similarity", "lch": "lch_similarity"}
    n = len(synsets)
    sim = np.zeros((n, n), dtype=np.float64)
    for i in range(n):
        for j in range(i, n):
            if i == j and measure in ("wup", "path"):
                sim[i, i] = 1.0
                continue
            value = getattr(synsets[i], method[measure])(synsets[j])
            if value is None:
                raise ValueError(
                    f"{measure} similarity undefined for {synsets[i].name()} and "
                    f"{synsets[j].name()} (no common hypernym)"
                )
            sim[i, j] = sim[j, i] = value
    return sim


def wordnet_similarity(
    dataset: str,
    class_names: Sequence[str] | None = None,
    measure: str = "wup",
    *,
    mapping: Mapping[str, str] | None = None,
    wn: WordNetCorpusReader | None = None,
) -> np.ndarray:
    """(C, C) WordNet similarity between a dataset's classes (default Wu-Palmer)."""
    if measure not in MEASURES:
        raise ValueError(f"unknown WordNet measure {measure!r}; choose one of {MEASURES}")
    return similarity_matrix(class_synsets(dataset, class_names, mapping=mapping, wn=wn), measure)


def _as_array(x: Any, what: str) -> np.ndarray:
    if hasattr(x, "detach"):  # a torch tensor, possibly on a GPU
        x = x.detach().cpu().numpy()
    arr = np.asarray(x, dtype=np.float64)
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{what} contains NaN or infinite values")
    return arr


def _square(x: Any, what: str) -> np.ndarray:
    arr = _as_array(x, what)
    if arr.ndim != 2 or arr.shape[0] != arr.shape[1]:
        raise ValueError(f"{what} must be a square (C, C) matrix, got shape {arr.shape}")
    return arr


def prototype_similarity(prototypes: Any) -> np.ndarray:
    """(C, C) cosine similarity between the rows of a (C, d) prototype array or tensor."""
    protos = _as_array(prototypes, "prototypes")
    if protos.ndim != 2 or protos.shape[0] < 2:
        raise ValueError(f"prototypes must be a (C, d) array with C >= 2, got {protos.shape}")
    norms = np.linalg.norm(protos, axis=1)
    zero = np.flatnonzero(norms == 0)
    if zero.size:
        raise ValueError(f"cosine similarity undefined: zero prototype for class(es) {zero}")
    unit = protos / norms[:, None]
    sim = np.clip(unit @ unit.T, -1.0, 1.0)
    np.fill_diagonal(sim, 1.0)
    return sim


def semantic_alignment(sim_model: Any, sim_reference: Any) -> float:
    """Spearman rho between two (C, C) similarity matrices over the class pairs i < j.

    Only the strict upper triangles are compared (the diagonal is not a class pair). NaN if
    either matrix is constant over those pairs (rho is then undefined).
    """
    from scipy.stats import spearmanr

    a = _square(sim_model, "sim_model")
    b = _square(sim_reference, "sim_reference")
    if a.shape != b.shape:
        raise ValueError(f"similarity matrices differ in size: {a.shape} vs {b.shape}")
    if a.shape[0] < 3:
        raise ValueError("semantic alignment needs at least 3 classes (2 class pairs)")
    upper = np.triu_indices(a.shape[0], k=1)
    x, y = a[upper], b[upper]
    if np.ptp(x) == 0 or np.ptp(y) == 0:
        warnings.warn("constant similarities: Spearman rho undefined", RuntimeWarning, 2)
        return float("nan")
    return float(spearmanr(x, y)[0])


def group_ids(dataset: str, class_names: Sequence[str] | None = None) -> list[int]:
    """Semantic-group id of each class (CIFAR-10 animals/vehicles, CIFAR-100 superclasses).

    Ids number the groups in `fedtsp.data.semantic_groups` order (CIFAR-100: coarse labels).
    """
    info = dataset_info(dataset)
    groups = semantic_groups(info.name)
    if not groups:
        raise ValueError(f"no semantic groups are defined for {info.title}")
    lookup = {_key(c): g for g, members in enumerate(groups.values()) for c in members}
    names = _class_names(info.name, class_names)
    unknown = [c for c in names if _key(c) not in lookup]
    if unknown:
        raise ValueError(f"class(es) in no {info.title} semantic group: {unknown}")
    return [lookup[_key(c)] for c in names]


# The gap is a difference of two means of similarities: where it is 0 in exact arithmetic
# (equiangular anchors, AlignFed) what remains is summation-order noise that differs between
# CPUs, so it is kept to a fixed number of decimals, far below any reading.
GAP_DECIMALS = 12


def semantic_gap(sim: Any, groups: Sequence[int]) -> float:
    """Mean similarity of same-group pairs minus mean of different-group pairs (pairs i < j),
    to `GAP_DECIMALS` decimals."""
    mat = _square(sim, "sim")
    labels = np.asarray(groups)
    if labels.ndim != 1 or len(labels) != mat.shape[0]:
        raise ValueError(f"need one group per class: {len(labels)} groups for {mat.shape[0]}")
    if len(np.unique(labels)) < 2:
        raise ValueError("semantic gap needs at least 2 groups")
    i, j = np.triu_indices(mat.shape[0], k=1)
    same = labels[i] == labels[j]
    if not same.any():
        raise ValueError("semantic gap needs a group with at least 2 classes")
    return round(float(mat[i[same], j[same]].mean() - mat[i[~same], j[~same]].mean()), GAP_DECIMALS)


# --------------------------------------------------------------------------------------------
# Figure
# --------------------------------------------------------------------------------------------


def plot_similarity_heatmap(
    sim: Any,
    class_names: Sequence[str],
    groups: Sequence[int] | None = None,
    ax: Axes | None = None,
    title: str | None = None,
    *,
    cmap: str = "viridis",
    vmin: float | None = None,
    vmax: float | None = None,
    cbar_label: str = "similarity",
) -> Figure:
    """Heatmap of a (C, C) similarity matrix; returns its figure.

    With ``groups`` (one id per class) the classes are sorted by group (stably, so the given
    order is kept inside a group) and white lines mark the group boundaries. Label and figure
    sizes scale with C so that CIFAR-100's 100 names stay legible when printed.
    """
    import matplotlib.pyplot as plt
    import seaborn as sns

    mat = _square(sim, "sim")
    n = mat.shape[0]
    names = [str(c) for c in class_names]
    if len(names) != n:
        raise ValueError(f"{len(names)} class names for a {n}x{n} matrix")
    order = np.arange(n)
    labels = None
    if groups is not None:
        labels = np.asarray(groups)
        if labels.ndim != 1 or len(labels) != n:
            raise ValueError(f"need one group per class: {len(labels)} groups for {n}")
        order = np.argsort(labels, kind="stable")
    mat = mat[np.ix_(order, order)]
    names = [names[k] for k in order]

    own_figure = ax is None
    if ax is None:
        side = min(max(4.5, 0.11 * n + 2.5), 14.0)
        fig, ax = plt.subplots(figsize=(side + 1.0, side))
    else:
        fig = ax.figure
    fontsize = 9 if n <= 20 else 7 if n <= 50 else 5
    sns.heatmap(
        mat,
        ax=ax,
        cmap=cmap,
        vmin=vmin,
        vmax=vmax,
        square=True,
        xticklabels=names,
        yticklabels=names,
        cbar_kws={"label": cbar_label, "shrink": 0.8},
    )
    ax.tick_params(axis="both", length=0, labelsize=fontsize)
    ax.set_xticklabels(ax.get_xticklabels(), rotation=90)
    ax.set_yticklabels(ax.get_yticklabels(), rotation=0)
    if labels is not None:
        sorted_labels = labels[order]
        for k in np.flatnonzero(sorted_labels[1:] != sorted_labels[:-1]) + 1:
            ax.axhline(k, color="white", linewidth=1.0 if n > 50 else 1.5)
            ax.axvline(k, color="white", linewidth=1.0 if n > 50 else 1.5)
    if title:
        ax.set_title(title)
    if own_figure:  # leave a caller's layout alone
        fig.tight_layout()
    return fig


PROMPT_SETS = ("manual", "short", "long")  # the handcrafted template and the two description sets
WORDNET_ROW = "WordNet Wu-Palmer (reference)"
# The encoder's float32 sums change with the thread count in about the 8th digit; a table
# computed live keeps 4 decimals so that every machine writes the same committed numbers.
LIVE_DECIMALS = 4


def untrained_text_semantics(
    dataset: str,
    class_names: Sequence[str],
    text_encoder: str = "minilm",
    prompts: str = "long",
) -> dict[str, float]:
    """rho and gap of the text encoder's own class prototypes before any training: the mean
    feature of each class's prompts, no context vectors (the prior FedTSP starts from)."""
    return (
        untrained_text_table({dataset: class_names}, [text_encoder], [prompts])
        .iloc[-1][["rho", "gap"]]
        .to_dict()
    )


def untrained_text_table(
    classes: Mapping[str, Sequence[str]],
    text_encoders: Sequence[str] = ("minilm",),
    prompt_sets: Sequence[str] = PROMPT_SETS,
) -> pd.DataFrame:
    """Per dataset (name -> class names): WordNet's own semantic gap (the reference row, rho
    1 by definition), then rho and gap of each text encoder's class prototypes before any
    training, per prompt set: each class's prototype is the mean feature of its prompts,
    no context vectors. Columns: dataset, text_encoder, prompts, rho, gap, rounded to
    LIVE_DECIMALS."""
    import pandas as pd

    from fedtsp.models.prompts import PromptLearner
    from fedtsp.models.text import build_text_encoder
    from fedtsp.text.descriptions import class_prompts

    encoders = {name: build_text_encoder(name) for name in text_encoders}
    rows = []
    for dataset, class_names in classes.items():
        names = list(class_names)
        reference, groups = wordnet_similarity(dataset, names), group_ids(dataset, names)
        rows.append((dataset, "-", WORDNET_ROW, 1.0, semantic_gap(reference, groups)))
        for name, encoder in encoders.items():
            for prompts in prompt_sets:
                learner = PromptLearner(
                    encoder, class_prompts(names, prompts, dataset=dataset), n_ctx=0
                )
                sim = prototype_similarity(learner.frozen_prototypes())
                rho, gap = semantic_alignment(sim, reference), semantic_gap(sim, groups)
                rows.append((dataset, name, prompts, rho, gap))
    table = pd.DataFrame(rows, columns=["dataset", "text_encoder", "prompts", "rho", "gap"])
    return table.round({"rho": LIVE_DECIMALS, "gap": LIVE_DECIMALS})

"""Class prompts for the text encoder: the handcrafted template or LLM-written descriptions.

Description files use the authors' JSON schema, one object per class:

    {"aquarium_fish": {"Short Label": "aquarium fish",
                       "Fine-grained Descriptions": ["...", "...", "..."],
                       "Hard Negatives": ["..."]},
     ...}

Top-level keys starting with "_" (e.g. "_meta") hold metadata and are ignored as classes.
"Hard Negatives" is unused by the reported runs and only read to be ignored. Description j of
class c becomes the prompt "A photo of a {Short Label}: {description_j}".

Two readers share the parsing:

- `load_descriptions` is lenient: any number of descriptions per class (at least one), and a
  missing "Short Label" falls back to the class name with spaces.
- `validate_descriptions` is the check to run before an experiment: every class present and
  no unknown one, exactly k non-empty string descriptions, a non-empty "Short Label", and,
  when a tokenizer is given, every prompt within the encoder's context length.

Committed description sets live in `fedtsp/text/description_sets/{dataset}_{variant}.json`
("short" and "long", k = 3; see `available_description_sets`). Their `_meta` block records who
wrote them and with which instruction.

Token-limit policy: a prompt that does not fit the context length is an error, never silently
truncated. `validate_descriptions` raises `DescriptionError` naming the file, the class, the
description index, the prompt's token count (start/end tokens included) and the limit. If
trainable prompt tokens will be inserted, pass their number as `reserved_tokens`; the limit is
then `context_length - reserved_tokens`. (The encoders' own `tokenize` still truncates, which
is why a run should validate its descriptions first.)

Every `DescriptionError` message starts with the file and, where one is involved, names the
class and the field.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedtsp.core.errors import UserError
from fedtsp.data import dataset_info

__all__ = [
    "DESCRIPTIONS_FIELD",
    "DESCRIPTION_SETS_DIR",
    "LABEL_FIELD",
    "PROMPT_KINDS",
    "DescriptionError",
    "DescriptionSet",
    "available_description_sets",
    "class_prompts",
    "description_set_path",
    "description_stats",
    "handcrafted_prompts",
    "load_description_set",
    "load_descriptions",
    "prompt_token_lengths",
    "resolve_description_set",
    "validate_descriptions",
]

LABEL_FIELD = "Short Label"
DESCRIPTIONS_FIELD = "Fine-grained Descriptions"
META_KEY = "_meta"
PROMPT_KINDS = ("manual", "short", "long", "descriptions")
DESCRIPTION_SETS_DIR = Path(__file__).resolve().parent / "description_sets"


class DescriptionError(UserError, ValueError):
    """A description file that does not match the schema (the message names file/class/field)."""


@dataclass
class DescriptionSet:
    """A validated description file: per-class labels, descriptions and prompts, in class order."""

    path: Path
    class_names: list[str]
    labels: list[str]
    descriptions: list[list[str]]
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def prompts(self) -> list[list[str]]:
        """ "A photo of a {label}: {description}" for every description, one list per class."""
        return [
            [_prompt(label, d) for d in descs]
            for label, descs in zip(self.labels, self.descriptions, strict=True)
        ]

    @property
    def k(self) -> int | None:
        """Descriptions per class, or None if classes differ."""
        counts = {len(d) for d in self.descriptions}
        return counts.pop() if len(counts) == 1 else None

    def __len__(self) -> int:
        return len(self.class_names)


# --------------------------------------------------------------------------- handcrafted


def _readable(name: str) -> str:
    return name.replace("_", " ").strip()


def _prompt(label: str, description: str) -> str:
    return f"A photo of a {label}: {description}"


def handcrafted_prompts(class_names: list[str]) -> list[list[str]]:
    """One prompt per class: "A photo of a {name}." (underscores become spaces)."""
    return [[f"A photo of a {_readable(n)}."] for n in class_names]


# --------------------------------------------------------------------------- parsing


def _key(name: str) -> str:
    # "aquarium_fish", "aquarium fish" and "Aquarium Fish" name the same class.
    return " ".join(name.replace("_", " ").split()).lower()


def _read_json(path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """(metadata, {class key as written: entry}) of a description file."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as err:
        raise DescriptionError(f"{path}: description file not found") from err
    except json.JSONDecodeError as err:
        raise DescriptionError(f"{path}: invalid JSON ({err})") from err
    except UnicodeDecodeError as err:
        raise DescriptionError(f"{path}: not UTF-8 text ({err})") from err
    if not isinstance(data, dict):
        raise DescriptionError(f"{path}: top level must be an object {{class_name: entry}}")
    meta = data.get(META_KEY, {})
    if not isinstance(meta, dict):
        raise DescriptionError(f"{path}: field {META_KEY!r} must be an object")
    return meta, {k: v for k, v in data.items() if not k.startswith("_")}


def _match_classes(
    path: Path, entries: dict[str, Any], class_names: list[str]
) -> list[tuple[str, Any]]:
    """(key as written, entry) for each of `class_names`, in that order."""
    by_key: dict[str, tuple[str, Any]] = {}
    for raw, entry in entries.items():
        k = _key(raw)
        if k in by_key:
            raise DescriptionError(
                f"{path}: classes {by_key[k][0]!r} and {raw!r} name the same class"
            )
        by_key[k] = (raw, entry)
    wanted = {_key(n) for n in class_names}
    unknown = [raw for k, (raw, _) in by_key.items() if k not in wanted]
    if unknown:
        raise DescriptionError(
            f"{path}: unknown class(es) {unknown} (not in the dataset's classes)"
        )
    missing = [n for n in class_names if _key(n) not in by_key]
    if missing:
        raise DescriptionError(f"{path}: no entry for class(es) {missing}")
    return [by_key[_key(n)] for n in class_names]


def _entry_fields(
    path: Path, name: str, raw: str, entry: Any, require_label: bool
) -> tuple[str, list[str]]:
    """(label, descriptions) of one class entry, stripped, or a DescriptionError."""
    where = f"{path}: class {raw!r}"
    if not isinstance(entry, dict):
        raise DescriptionError(f"{where}: entry must be an object with {DESCRIPTIONS_FIELD!r}")
    if LABEL_FIELD not in entry and require_label:
        raise DescriptionError(f"{where}: field {LABEL_FIELD!r} is missing")
    label = entry.get(LABEL_FIELD, _readable(name))
    if not isinstance(label, str) or not label.strip():
        raise DescriptionError(f"{where}: field {LABEL_FIELD!r} must be a non-empty string")
    descs = entry.get(DESCRIPTIONS_FIELD)
    if descs is None:
        raise DescriptionError(f"{where}: field {DESCRIPTIONS_FIELD!r} is missing")
    if not isinstance(descs, list):
        raise DescriptionError(
            f"{where}: field {DESCRIPTIONS_FIELD!r} must be a list of strings, "
            f"not {type(descs).__name__}"
        )
    if not descs:
        raise DescriptionError(f"{where}: field {DESCRIPTIONS_FIELD!r} is empty")
    for j, d in enumerate(descs):
        if not isinstance(d, str):
            raise DescriptionError(
                f"{where}: field {DESCRIPTIONS_FIELD!r} must be a list of strings; "
                f"description {j} is {type(d).__name__}"
            )
        if not d.strip():
            raise DescriptionError(
                f"{where}: field {DESCRIPTIONS_FIELD!r}: description {j} is an empty string"
            )
    return label.strip(), [d.strip() for d in descs]


def _build_set(
    path: str | Path, class_names: list[str] | None, k: int | None, require_label: bool
) -> DescriptionSet:
    path = Path(path)
    meta, entries = _read_json(path)
    if class_names is None:  # take the file's own classes (for statistics)
        class_names = list(entries)
    matched = _match_classes(path, entries, list(class_names))
    labels, descriptions = [], []
    for name, (raw, entry) in zip(class_names, matched, strict=True):
        label, descs = _entry_fields(path, name, raw, entry, require_label)
        if k is not None and len(descs) != k:
            raise DescriptionError(
                f"{path}: class {raw!r}: field {DESCRIPTIONS_FIELD!r} has {len(descs)} "
                f"description(s), expected k={k}"
            )
        labels.append(label)
        descriptions.append(descs)
    return DescriptionSet(path, list(class_names), labels, descriptions, dict(meta))


def load_descriptions(path: str | Path, class_names: list[str]) -> list[list[str]]:
    """Prompts "A photo of a {label}: {description_j}" for every class, in `class_names` order.

    Lenient reader: any number (>= 1) of descriptions per class; `label` is the entry's
    "Short Label" if present, else the class name with spaces. Raises `DescriptionError`
    naming the file, class and field for: invalid JSON, a missing or unknown class, a
    missing/empty "Fine-grained Descriptions", or non-string entries.
    """
    return _build_set(path, class_names, k=None, require_label=False).prompts


# --------------------------------------------------------------------------- validation


def _token_counter(tokenizer: Any) -> tuple[Callable[[str], int], int | None]:
    """(text -> token count with start/end tokens, the tokenizer's own context length or None).

    Accepts a fedtsp `TextEncoder`, an open_clip tokenizer, a Hugging Face tokenizer, or any
    callable that returns the token ids of a text (special tokens included).
    """
    limit = None
    if hasattr(tokenizer, "embed_tokens") and hasattr(tokenizer, "tokenizer"):
        limit = int(tokenizer.context_length)  # a TextEncoder: its limit, its tokenizer
        tokenizer = tokenizer.tokenizer
    if hasattr(tokenizer, "sot_token_id") and hasattr(tokenizer, "encode"):
        # open_clip's SimpleTokenizer: encode() gives the ids without <sot>/<eot>.
        own = getattr(tokenizer, "context_length", None)
        return (lambda t: len(tokenizer.encode(t)) + 2), limit or own
    if hasattr(tokenizer, "model_max_length"):
        # Hugging Face: [CLS] ... [SEP]. model_max_length is a huge sentinel when unset.
        own = int(tokenizer.model_max_length)
        own_limit = own if own < 1_000_000 else None
        return (
            lambda t: len(tokenizer(t, add_special_tokens=True, truncation=False)["input_ids"])
        ), limit or own_limit
    if callable(tokenizer):
        return (lambda t: len(tokenizer(t))), limit
    raise TypeError(f"cannot count tokens with {type(tokenizer).__name__}")


def prompt_token_lengths(desc_set: DescriptionSet, tokenizer: Any) -> list[list[int]]:
    """Token count (start/end tokens included) of every prompt of `desc_set`, per class."""
    count, _ = _token_counter(tokenizer)
    return [[count(p) for p in prompts] for prompts in desc_set.prompts]


def validate_descriptions(
    path: str | Path,
    class_names: list[str],
    k: int | None = 3,
    context_length: int | None = None,
    tokenizer: Any = None,
    reserved_tokens: int = 0,
) -> DescriptionSet:
    """Check a description file against a dataset's classes; return it as a `DescriptionSet`.

    Requires valid JSON, every class of `class_names` and no other (keys starting with "_" are
    metadata), a non-empty "Short Label", and exactly `k` non-empty string descriptions per
    class (`k=None`: any number >= 1, but exactly `_meta.k` if the file states one). If `_meta`
    states a `k`, it must equal `k`.

    With a `tokenizer` (a `TextEncoder`, an open_clip or Hugging Face tokenizer), every prompt
    "A photo of a {label}: {description}" must have at most `context_length - reserved_tokens`
    tokens, start/end tokens included; `context_length` defaults to the encoder's (or the
    tokenizer's) own. Too-long prompts are an error, never truncated. Every failure raises
    `DescriptionError` naming the file, the class and the field.
    """
    if k is not None and k < 1:
        raise ValueError(f"k must be >= 1 or None, got {k}")
    desc_set = _build_set(path, class_names, k=k, require_label=True)
    meta_k = desc_set.metadata.get("k")
    if k is not None and meta_k is not None and meta_k != k:
        raise DescriptionError(f"{desc_set.path}: field '_meta.k' is {meta_k!r}, expected {k}")
    if k is None and meta_k is not None:
        # Any k is allowed, but a file that states its k must hold that many per class.
        if not isinstance(meta_k, int) or meta_k < 1:
            raise DescriptionError(f"{desc_set.path}: field '_meta.k' must be an integer >= 1")
        desc_set = _build_set(path, class_names, k=meta_k, require_label=True)
    if tokenizer is None:
        if context_length is not None:
            raise ValueError("context_length needs a tokenizer to count tokens with")
        return desc_set

    count, own_limit = _token_counter(tokenizer)
    context_length = context_length if context_length is not None else own_limit
    if context_length is None:
        raise ValueError(f"give context_length: {type(tokenizer).__name__} does not state one")
    limit = context_length - reserved_tokens
    if limit < 1:
        raise ValueError(
            f"reserved_tokens={reserved_tokens} leaves no room in context length {context_length}"
        )
    for name, prompts in zip(desc_set.class_names, desc_set.prompts, strict=True):
        for j, prompt in enumerate(prompts):
            n = count(prompt)
            if n > limit:
                reserved = f" ({reserved_tokens} reserved for prompt vectors)" * bool(
                    reserved_tokens
                )
                raise DescriptionError(
                    f"{desc_set.path}: class {name!r}: field {DESCRIPTIONS_FIELD!r}: "
                    f"description {j} gives a prompt of {n} tokens, over the limit of {limit}"
                    f"{reserved}; shorten it (prompts are not truncated)"
                )
    return desc_set


# --------------------------------------------------------------------------- committed sets


def _dataset_name(dataset: str) -> str:

    return dataset_info(dataset).name


def available_description_sets(dataset: str) -> list[str]:
    """Variants (e.g. ["long", "short"]) committed in `fedtsp/text/description_sets/` for `dataset`."""
    prefix = f"{_dataset_name(dataset)}_"
    return sorted(
        p.stem[len(prefix) :]
        for p in DESCRIPTION_SETS_DIR.glob(f"{prefix}*.json")
        if p.stem[len(prefix) :]
    )


def resolve_description_set(name_or_path: str | Path) -> Path:
    """A description file given as a path, or as the name of a committed set (`cifar10_long`)."""
    path = Path(name_or_path)
    if path.is_file():
        return path
    committed = DESCRIPTION_SETS_DIR / f"{name_or_path}.json"
    if committed.is_file():
        return committed
    names = sorted(p.stem for p in DESCRIPTION_SETS_DIR.glob("*.json"))
    raise DescriptionError(
        f"description set {str(name_or_path)!r} is neither a file nor a committed set; "
        f"committed sets: {', '.join(names)}"
    )


def description_set_path(dataset: str, variant: str) -> Path:
    """Path of the committed description set `variant` ("short", "long") of `dataset`."""
    name = _dataset_name(dataset)
    path = DESCRIPTION_SETS_DIR / f"{name}_{variant}.json"
    if not path.is_file():
        have = available_description_sets(name)
        raise DescriptionError(
            f"{path}: no {variant!r} description set for {name}; available: {have or 'none'}"
        )
    return path


def description_set_classes(dataset: str, variant: str = "long") -> list[str]:
    """Class keys of a committed set, in file order (Tiny-ImageNet's wnids come from here
    when no copy of the dataset is at hand)."""
    data = json.loads(description_set_path(dataset, variant).read_text(encoding="utf-8"))
    return [key for key in data if not key.startswith("_")]


def load_description_set(
    dataset: str, variant: str, class_names: list[str], k: int = 3, **check: Any
) -> list[list[str]]:
    """Prompts of a committed description set, validated against `class_names` first.

    Extra keywords (`tokenizer`, `context_length`, `reserved_tokens`) go to
    `validate_descriptions`.
    """
    path = description_set_path(dataset, variant)
    return validate_descriptions(path, class_names, k=k, **check).prompts


def class_prompts(
    class_names: list[str],
    prompts: str = "manual",
    description_file: str | Path | None = None,
    dataset: str | None = None,
) -> list[list[str]]:
    """Prompts per class, one list per class in `class_names` order.

    - `"manual"`: the handcrafted template "A photo of a {name}.";
    - `"short"` / `"long"`: the committed description set of `dataset`, validated (k = 3);
    - `"descriptions"`: `description_file` in the authors' schema (lenient reader).
    """
    if prompts == "manual":
        return handcrafted_prompts(class_names)
    if prompts in ("short", "long"):
        if dataset is None:
            raise ValueError(f'prompts="{prompts}" needs the dataset name (dataset=...)')
        return load_description_set(dataset, prompts, class_names)
    if prompts == "descriptions":
        if description_file is None:
            raise ValueError('prompts="descriptions" needs a description_file')
        return load_descriptions(description_file, class_names)
    raise ValueError(f"prompts must be one of {PROMPT_KINDS}, got {prompts!r}")


def description_stats(
    path_or_set: str | Path | DescriptionSet, tokenizer: Any = None
) -> dict[str, Any]:
    """Summary of a description set: classes, k, words per description, metadata.

    A path is read with its own classes (no dataset check). With a `tokenizer`, also the
    longest prompt in tokens (`tokens_max`) and where it is.
    """
    if isinstance(path_or_set, DescriptionSet):
        desc_set = path_or_set
    else:
        desc_set = _build_set(path_or_set, None, k=None, require_label=False)
    words = [len(d.split()) for descs in desc_set.descriptions for d in descs]
    if not words:
        raise DescriptionError(f"{desc_set.path}: no classes to summarise")
    stats: dict[str, Any] = {
        "path": str(desc_set.path),
        "classes": len(desc_set),
        "k": desc_set.k,
        "descriptions": len(words),
        "words_mean": round(statistics.fmean(words), 2),
        "words_min": min(words),
        "words_max": max(words),
        "metadata": dict(desc_set.metadata),
    }
    if tokenizer is not None:
        lengths = prompt_token_lengths(desc_set, tokenizer)
        n, c, j = max((n, c, j) for c, row in enumerate(lengths) for j, n in enumerate(row))
        stats["tokens_max"] = n
        stats["tokens_max_at"] = f"{desc_set.class_names[c]}[{j}]"
    return stats

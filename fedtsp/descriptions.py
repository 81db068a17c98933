"""Class prompts for the text encoder: the handcrafted template or LLM-written descriptions.

Description files use the authors' JSON schema, one object per class:

    {"aquarium_fish": {"Short Label": "aquarium fish",
                       "Fine-grained Descriptions": ["...", "...", "..."],
                       "Hard Negatives": ["..."]},
     ...}

Top-level keys starting with "_" (e.g. "_meta") hold metadata and are ignored here.
"Hard Negatives" is unused by the reported runs and only read to be ignored.
"""

from __future__ import annotations

import json
from pathlib import Path

__all__ = [
    "DESCRIPTIONS_FIELD",
    "LABEL_FIELD",
    "PROMPT_KINDS",
    "DescriptionError",
    "class_prompts",
    "handcrafted_prompts",
    "load_descriptions",
]

LABEL_FIELD = "Short Label"
DESCRIPTIONS_FIELD = "Fine-grained Descriptions"
PROMPT_KINDS = ("manual", "descriptions")


class DescriptionError(ValueError):
    """A description file that does not match the schema (the message names file/class/field)."""


def _readable(name: str) -> str:
    return name.replace("_", " ").strip()


def handcrafted_prompts(class_names: list[str]) -> list[list[str]]:
    """One prompt per class: "A photo of a {name}." (underscores become spaces)."""
    return [[f"A photo of a {_readable(n)}."] for n in class_names]


def _key(name: str) -> str:
    # "aquarium_fish", "aquarium fish" and "Aquarium Fish" name the same class.
    return " ".join(name.replace("_", " ").split()).lower()


def load_descriptions(path: str | Path, class_names: list[str]) -> list[list[str]]:
    """Prompts "A photo of a {label}: {description_j}" for every class, in `class_names` order.

    `label` is the entry's "Short Label" if present, else the class name with spaces.
    Raises `DescriptionError` naming the file, class and field for: invalid JSON, a missing or
    unknown class, a missing/empty "Fine-grained Descriptions", or non-string entries.
    """
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as err:
        raise DescriptionError(f"{path}: description file not found") from err
    except json.JSONDecodeError as err:
        raise DescriptionError(f"{path}: invalid JSON ({err})") from err
    if not isinstance(data, dict):
        raise DescriptionError(f"{path}: top level must be an object {{class_name: entry}}")

    entries: dict[str, tuple[str, object]] = {}
    for raw_key, entry in data.items():
        if raw_key.startswith("_"):
            continue  # metadata ("_meta", ...)
        k = _key(raw_key)
        if k in entries:
            raise DescriptionError(
                f"{path}: classes {entries[k][0]!r} and {raw_key!r} name the same class"
            )
        entries[k] = (raw_key, entry)

    wanted = {_key(n): n for n in class_names}
    unknown = [raw for k, (raw, _) in entries.items() if k not in wanted]
    if unknown:
        raise DescriptionError(
            f"{path}: unknown class(es) {unknown} (not in the dataset's classes)"
        )
    missing = [n for n in class_names if _key(n) not in entries]
    if missing:
        raise DescriptionError(f"{path}: no entry for class(es) {missing}")

    prompts = []
    for name in class_names:
        raw, entry = entries[_key(name)]
        where = f"{path}: class {raw!r}"
        if not isinstance(entry, dict):
            raise DescriptionError(f"{where}: entry must be an object with {DESCRIPTIONS_FIELD!r}")
        label = entry.get(LABEL_FIELD, _readable(name))
        if not isinstance(label, str) or not label.strip():
            raise DescriptionError(f"{where}: field {LABEL_FIELD!r} must be a non-empty string")
        descs = entry.get(DESCRIPTIONS_FIELD)
        if descs is None:
            raise DescriptionError(f"{where}: field {DESCRIPTIONS_FIELD!r} is missing")
        if not isinstance(descs, list) or not all(isinstance(d, str) for d in descs):
            raise DescriptionError(
                f"{where}: field {DESCRIPTIONS_FIELD!r} must be a list of strings"
            )
        descs = [d.strip() for d in descs]
        if not descs or not all(descs):
            raise DescriptionError(
                f"{where}: field {DESCRIPTIONS_FIELD!r} is empty or holds an empty string"
            )
        prompts.append([f"A photo of a {label.strip()}: {d}" for d in descs])
    return prompts


def class_prompts(
    class_names: list[str], prompts: str = "manual", description_file: str | Path | None = None
) -> list[list[str]]:
    """Prompts per class: `"manual"` (handcrafted template) or `"descriptions"` (from a file)."""
    if prompts == "manual":
        return handcrafted_prompts(class_names)
    if prompts == "descriptions":
        if description_file is None:
            raise ValueError('prompts="descriptions" needs a description_file')
        return load_descriptions(description_file, class_names)
    raise ValueError(f"prompts must be one of {PROMPT_KINDS}, got {prompts!r}")

"""The request a class gets and the answer it must come back with (the authors' JSON schema)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from fedtsp.text.describe.errors import DescribeInputError, MalformedAnswer

LABEL_FIELD = "Short Label"
DESCRIPTIONS_FIELD = "Fine-grained Descriptions"
NEGATIVES_FIELD = "Hard Negatives"

VARIANTS = ("long", "short")
SCHEMA = (
    '{class: {"Short Label": str, "Fine-grained Descriptions": [k str], '
    '"Hard Negatives": [] (unused)}}'
)

SNIPPET_CHARS = 200

# The aspects the k descriptions cover, in order; more than three add further visual details.
_ASPECTS = (
    "its visual appearance (shape, size, colours, parts, texture)",
    "its function or behaviour (what it does or is used for, how it moves or acts)",
    "its typical environment (where it is usually seen and what surrounds it)",
)
_EXTRA_ASPECT = "another distinctive visual detail that tells it apart from similar classes"
_LENGTH = {
    # CLIP's text tower reads at most 77 tokens, the "A photo of a <label>: " prefix included.
    "long": "Each description is one or two complete sentences, at most 40 words in all.",
    "short": "Each description is a single short line of at most 12 words.",
}


@dataclass(frozen=True)
class ClassSpec:
    """One class: `key` names it in the description file, `name` is what the model is told."""

    key: str
    name: str


def _aspects(k: int) -> list[str]:
    return [_ASPECTS[j] if j < len(_ASPECTS) else _EXTRA_ASPECT for j in range(k)]


def instruction_text(variant: str, k: int) -> str:
    """The system instruction sent with every request (stored verbatim in `_meta.instruction`)."""
    check_variant(variant)
    check_k(k)
    aspects = "\n".join(f"{j + 1}. {a}" for j, a in enumerate(_aspects(k)))
    slots = ", ".join(f'"<description {j + 1}>"' for j in range(k))
    noun = "description" if k == 1 else "descriptions"
    return (
        "You write descriptions of the object classes of an image-classification dataset; a "
        "text encoder reads them as 'A photo of a <label>: <description>' to recognise the "
        f"class in photos. For the class named by the user, write {k} fine-grained {noun}, "
        f"each about a different aspect:\n{aspects}\n"
        f"{_LENGTH[variant]} Describe what can be seen in a photo; do not repeat the class "
        "name at the start of a description.\n"
        "Answer with a single JSON object and nothing else:\n"
        f'{{"{LABEL_FIELD}": "<the common name of the class, a few words>", '
        f'"{DESCRIPTIONS_FIELD}": [{slots}]}}'
    )


def request_template(dataset_title: str) -> str:
    """The user message with a `{class}` placeholder (stored verbatim in `_meta.request`)."""
    return 'Class: "{class}" (from the ' + dataset_title + " dataset)"


def build_messages(spec: ClassSpec, dataset_title: str, variant: str, k: int) -> list[dict]:
    """The chat messages for one class: the system instruction and the class request."""
    user = request_template(dataset_title).replace("{class}", spec.name)
    return [
        {"role": "system", "content": instruction_text(variant, k)},
        {"role": "user", "content": user},
    ]


def snippet(text: str, limit: int = SNIPPET_CHARS) -> str:
    flat = " ".join(str(text).split())
    return repr(flat if len(flat) <= limit else flat[:limit] + "...")


_FENCE = re.compile(r"```[ \t]*(?:json|JSON)?[ \t]*\n?(.*?)```", re.DOTALL)


def entry_problem(entry: Any, k: int) -> str | None:
    """Why `entry` is not a valid class entry with exactly k descriptions (None if it is)."""
    if not isinstance(entry, dict):
        return "the answer is not a JSON object"
    label = entry.get(LABEL_FIELD)
    if not isinstance(label, str) or not label.strip():
        return f"field {LABEL_FIELD!r} is missing or not a non-empty string"
    descs = entry.get(DESCRIPTIONS_FIELD)
    if not isinstance(descs, list):
        return f"field {DESCRIPTIONS_FIELD!r} is missing or not a list"
    if len(descs) != k:
        return f"field {DESCRIPTIONS_FIELD!r} holds {len(descs)} descriptions, expected {k}"
    if not all(isinstance(d, str) and d.strip() for d in descs):
        return f"field {DESCRIPTIONS_FIELD!r} holds an empty or non-string description"
    return None


def parse_answer(text: str, k: int) -> dict:
    """The class entry in an answer: JSON, possibly in a ```json fence or surrounded by prose.

    Returns ``{"Short Label": str, "Fine-grained Descriptions": [k str], "Hard Negatives": []}``
    (strings stripped); raises `MalformedAnswer` saying what is wrong.
    """
    if not isinstance(text, str) or not text.strip():
        raise MalformedAnswer("the answer is empty")
    body = text.strip()
    fenced = _FENCE.search(body)
    if fenced:
        body = fenced.group(1).strip()
    try:
        data = json.loads(body)
    except json.JSONDecodeError:
        start, end = body.find("{"), body.rfind("}")
        if start < 0 or end <= start:
            raise MalformedAnswer("the answer holds no JSON object") from None
        try:
            data = json.loads(body[start : end + 1])
        except json.JSONDecodeError as err:
            raise MalformedAnswer(f"the answer is not valid JSON ({err.msg})") from None
    problem = entry_problem(data, k)
    if problem:
        raise MalformedAnswer(problem)
    return {
        LABEL_FIELD: " ".join(data[LABEL_FIELD].split()),
        DESCRIPTIONS_FIELD: [d.strip() for d in data[DESCRIPTIONS_FIELD]],
        NEGATIVES_FIELD: [],
    }


def check_variant(variant: str) -> None:
    if variant not in VARIANTS:
        raise DescribeInputError(f"variant must be one of {', '.join(VARIANTS)}, got {variant!r}")


def check_k(k: int) -> None:
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise DescribeInputError(f"k (descriptions per class) must be an integer >= 1, got {k!r}")

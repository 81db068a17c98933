"""`fedtsp describe`: have a language model write the class descriptions FedTSP encodes.

One request per class asks for a JSON object

    {"Short Label": "...", "Fine-grained Descriptions": ["...", ...k strings]}

covering the class's appearance, its function or behaviour and its typical environment.
Answers are checked, retried when malformed or when the service is busy, and written to a
description file in the authors' schema (see `fedtsp.descriptions`) with a `_meta` block
recording the exact instruction, the model, the date, the variant and k.

Two providers:

* ``openai``: any OpenAI-compatible Chat Completions endpoint, spoken to with the standard
  library (no `openai` package). The API key is read only from an environment variable
  (``OPENAI_API_KEY`` unless ``--api-key-env`` names another) and is masked in every message.
* ``local``: a local transformers text-generation model directory, greedy decoding.

The output file is rewritten atomically after every class, so an interrupted run resumes where
it stopped (classes already in the file are kept and skipped; ``--force`` regenerates them).
"""

from __future__ import annotations

import argparse
import email.utils
import http.client
import json
import logging
import math
import os
import random
import re
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Protocol

from fedtsp.atomic import atomic_write_bytes
from fedtsp.errors import UserError, debug_requested, one_line

__all__ = [
    "DEFAULT_API_KEY_ENV",
    "DEFAULT_BASE_URL",
    "PROVIDERS",
    "SCHEMA",
    "VARIANTS",
    "ChatClient",
    "ClassSpec",
    "DescribeError",
    "DescribeInputError",
    "LocalChat",
    "MalformedAnswer",
    "OpenAIChat",
    "ProviderError",
    "TransientError",
    "add_describe_parser",
    "backoff_delay",
    "build_messages",
    "describe",
    "generate_descriptions",
    "instruction_text",
    "parse_answer",
    "request_template",
    "resolve_classes",
    "run_describe",
]

log = logging.getLogger(__name__)

LABEL_FIELD = "Short Label"
DESCRIPTIONS_FIELD = "Fine-grained Descriptions"
NEGATIVES_FIELD = "Hard Negatives"

VARIANTS = ("long", "short")
PROVIDERS = ("openai", "local")
DEFAULT_BASE_URL = "https://api.openai.com/v1"
DEFAULT_API_KEY_ENV = "OPENAI_API_KEY"
SCHEMA = (
    '{class: {"Short Label": str, "Fine-grained Descriptions": [k str], '
    '"Hard Negatives": [] (unused)}}'
)

# HTTP statuses worth retrying besides 5xx: timeout, conflict, too early, rate limit.
RETRY_STATUSES = frozenset({408, 409, 425, 429})
BACKOFF_BASE_S = 1.0
BACKOFF_CAP_S = 60.0
MAX_RETRY_AFTER_S = 600.0
SNIPPET_CHARS = 200
# Committed description sets; Tiny-ImageNet's class list (wnids) falls back to theirs.
COMMITTED_SETS = Path(__file__).resolve().parent / "description_sets"
EXIT_BAD_INPUT = 2
EXIT_FAILED = 1

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


# --------------------------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------------------------


class DescribeError(RuntimeError):
    """Generation failed (the message names the class and the reason)."""


class DescribeInputError(UserError, DescribeError):
    """Bad input found before any request was sent."""


class TransientError(Exception):
    """A failure worth retrying (rate limit, server error, timeout, lost connection)."""

    def __init__(self, reason: str, retry_after: float | None = None) -> None:
        super().__init__(reason)
        self.retry_after = retry_after


class ProviderError(Exception):
    """A failure that retrying will not fix (e.g. HTTP 401/404 from the API)."""


class MalformedAnswer(ValueError):
    """The model's answer is not the requested JSON object."""


# --------------------------------------------------------------------------------------------
# Prompts and answers
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ClassSpec:
    """One class: `key` names it in the description file, `name` is what the model is told."""

    key: str
    name: str


def _aspects(k: int) -> list[str]:
    return [_ASPECTS[j] if j < len(_ASPECTS) else _EXTRA_ASPECT for j in range(k)]


def instruction_text(variant: str, k: int) -> str:
    """The system instruction sent with every request (stored verbatim in `_meta.instruction`)."""
    _check_variant(variant)
    _check_k(k)
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


def _snippet(text: str, limit: int = SNIPPET_CHARS) -> str:
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


# --------------------------------------------------------------------------------------------
# Providers
# --------------------------------------------------------------------------------------------


class ChatClient(Protocol):
    """Anything that turns chat messages into the model's answer text."""

    def complete(self, messages: list[dict]) -> str: ...


def _mask(text: str, secret: str | None) -> str:
    """`text` with every occurrence of `secret` replaced by ``***``."""
    text = str(text)
    if secret:
        text = text.replace(secret, "***")
    return text


def _parse_retry_after(value: str | None) -> float | None:
    """Seconds from a ``Retry-After`` header (delta-seconds or an HTTP date), else None."""
    if value is None or not value.strip():
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=timezone.utc)
        seconds = (when - datetime.now(timezone.utc)).total_seconds()
    if not math.isfinite(seconds):
        return None
    return min(max(seconds, 0.0), MAX_RETRY_AFTER_S)


def _public_url(url: str) -> str:
    """`url` without user info, query or fragment (safe to store and print)."""
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    return urllib.parse.urlunsplit((parts.scheme, host, parts.path, "", ""))


class OpenAIChat:
    """An OpenAI-compatible ``/chat/completions`` endpoint over plain HTTP(S)."""

    def __init__(
        self,
        model: str,
        api_key: str,
        base_url: str = DEFAULT_BASE_URL,
        timeout: float = 60.0,
        temperature: float | None = None,
        max_tokens: int | None = None,
    ) -> None:
        self.model = model
        self._key = api_key
        self.base_url = base_url.rstrip("/")
        self.url = self.base_url + "/chat/completions"
        self.timeout = timeout
        self.temperature = temperature
        self.max_tokens = max_tokens

    def __repr__(self) -> str:
        return f"OpenAIChat(model={self.model!r}, base_url={_public_url(self.base_url)!r})"

    def _safe(self, text: str) -> str:
        return _mask(text, self._key)

    def complete(self, messages: list[dict]) -> str:
        payload: dict[str, Any] = {"model": self.model, "messages": messages}
        if self.temperature is not None:
            payload["temperature"] = self.temperature
        if self.max_tokens is not None:
            payload["max_tokens"] = self.max_tokens
        request = urllib.request.Request(
            self.url,
            data=json.dumps(payload).encode("utf-8"),
            method="POST",
            headers={
                "Content-Type": "application/json",
                "Accept": "application/json",
                "Authorization": f"Bearer {self._key}",
            },
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                raw = response.read()
        except urllib.error.HTTPError as err:
            detail = self._error_detail(err)
            retry_after = _parse_retry_after(
                err.headers.get("Retry-After") if err.headers else None
            )
            err.close()
            if err.code in RETRY_STATUSES or err.code >= 500:
                raise TransientError(f"HTTP {err.code}{detail}", retry_after) from None
            raise ProviderError(f"the API refused the request (HTTP {err.code}{detail})") from None
        except TimeoutError:
            raise TransientError(f"no answer within the {self.timeout:g} s timeout") from None
        except urllib.error.URLError as err:
            if isinstance(err.reason, TimeoutError):
                raise TransientError(f"no answer within the {self.timeout:g} s timeout") from None
            raise TransientError(
                f"cannot reach {_public_url(self.url)} ({self._safe(err.reason)})"
            ) from None
        except (OSError, http.client.HTTPException) as err:
            raise TransientError(
                f"connection to {_public_url(self.url)} failed ({type(err).__name__}: "
                f"{self._safe(err)})"
            ) from None
        return self._content(raw)

    def _error_detail(self, err: urllib.error.HTTPError) -> str:
        try:
            body = err.read().decode("utf-8", "replace")
        except Exception:  # the body is only a courtesy for the message
            return ""
        message = body
        try:
            data = json.loads(body)
            if isinstance(data, dict):
                inner = data.get("error", data)
                if isinstance(inner, dict) and isinstance(inner.get("message"), str):
                    message = inner["message"]
                elif isinstance(inner, str):
                    message = inner
        except json.JSONDecodeError:
            pass
        message = self._safe(message).strip()
        return f": {_snippet(message)}" if message else ""

    def _content(self, raw: bytes) -> str:
        text = raw.decode("utf-8", "replace")
        try:
            data = json.loads(text)
            content = data["choices"][0]["message"]["content"]
        except (json.JSONDecodeError, KeyError, IndexError, TypeError):
            raise MalformedAnswer(
                f"the response is not a chat completion: {_snippet(self._safe(text))}"
            ) from None
        if not isinstance(content, str):
            raise MalformedAnswer("the response's message has no text content")
        return content


class LocalChat:
    """A local transformers causal language model, greedy decoding."""

    def __init__(self, path: str | Path, max_new_tokens: int = 512, device: str = "auto") -> None:
        path = Path(path).expanduser()
        if not path.exists():
            raise DescribeInputError(f"local model directory {path} does not exist")
        if not path.is_dir() or not (path / "config.json").is_file():
            raise DescribeInputError(
                f"{path} is not a transformers model directory (no config.json in it)"
            )
        import torch
        import transformers
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        major_minor = tuple(int(p) for p in re.findall(r"\d+", transformers.__version__)[:2])
        dtype_kw = "dtype" if major_minor >= (4, 56) else "torch_dtype"
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
            self.model = AutoModelForCausalLM.from_pretrained(
                path, local_files_only=True, **{dtype_kw: "auto"}
            )
        except Exception as err:  # transformers raises many types; the first line says enough
            first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise DescribeInputError(f"cannot load the local model in {path}: {first}") from None
        self.model.to(device).eval()
        self.device = device
        self.path = path
        self.max_new_tokens = max_new_tokens

    def prompt(self, messages: list[dict]) -> str:
        """The text fed to the model: the chat template if the tokenizer has one."""
        if getattr(self.tokenizer, "chat_template", None):
            return self.tokenizer.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=True
            )
        parts = [m["content"] for m in messages]
        return "\n\n".join(parts) + "\n\nJSON answer:\n"

    def complete(self, messages: list[dict]) -> str:
        import torch

        templated = bool(getattr(self.tokenizer, "chat_template", None))
        enc = self.tokenizer(
            self.prompt(messages), return_tensors="pt", add_special_tokens=not templated
        )
        enc = {name: t.to(self.device) for name, t in enc.items()}
        pad = self.tokenizer.pad_token_id
        if pad is None:
            pad = self.tokenizer.eos_token_id
        with torch.no_grad():
            out = self.model.generate(
                **enc, do_sample=False, max_new_tokens=self.max_new_tokens, pad_token_id=pad
            )
        new = out[0, enc["input_ids"].shape[1] :]
        return self.tokenizer.decode(new, skip_special_tokens=True)


# --------------------------------------------------------------------------------------------
# Classes
# --------------------------------------------------------------------------------------------


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
    from fedtsp.data import dataset_info

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


# --------------------------------------------------------------------------------------------
# Generation loop
# --------------------------------------------------------------------------------------------


def _sleep(seconds: float) -> None:
    """Backoff pause (tests replace this)."""
    time.sleep(seconds)


def backoff_delay(
    attempt: int,
    retry_after: float | None = None,
    *,
    base: float = BACKOFF_BASE_S,
    cap: float = BACKOFF_CAP_S,
    rng: random.Random | None = None,
) -> float:
    """Seconds to wait before retry number `attempt` + 1 (attempt counts from 0).

    A server's ``Retry-After`` wins (capped at `MAX_RETRY_AFTER_S`); otherwise exponential
    ``base * 2**attempt`` capped at `cap`, times a jitter factor in [0.5, 1).
    """
    if retry_after is not None:
        return min(max(retry_after, 0.0), MAX_RETRY_AFTER_S)
    delay = min(cap, base * 2.0 ** min(attempt, 30))
    return delay * (0.5 + 0.5 * (rng or random).random())


def _ask(
    client: ChatClient,
    messages: list[dict],
    spec: ClassSpec,
    k: int,
    retries: int,
    secret: str | None,
) -> dict:
    """One class's entry, retrying transient failures and malformed answers."""
    tries = retries + 1
    last = ""
    for attempt in range(tries):
        text: str | None = None
        try:
            text = client.complete(messages)
            return parse_answer(text, k)
        except TransientError as err:
            last = _mask(str(err), secret)
            if attempt + 1 >= tries:
                break
            delay = backoff_delay(attempt, err.retry_after)
            log.warning(
                "class %r: %s; retrying in %.1f s (attempt %d of %d)",
                spec.key, last, delay, attempt + 2, tries,
            )  # fmt: skip
            _sleep(delay)
        except MalformedAnswer as err:
            reason = _mask(str(err), secret)
            last = reason if text is None else f"{reason}; answer: {_snippet(_mask(text, secret))}"
            if attempt + 1 < tries:
                log.warning(
                    "class %r: malformed answer (%s); asking again (attempt %d of %d)",
                    spec.key, reason, attempt + 2, tries,
                )  # fmt: skip
        except ProviderError as err:
            raise DescribeError(f"class {spec.key!r}: {_mask(str(err), secret)}") from None
    raise DescribeError(
        f"class {spec.key!r} ({spec.name}): no valid answer after {tries} attempt"
        f"{'s' if tries != 1 else ''}; last problem: {last}"
    )


def _today() -> str:
    return datetime.now(timezone.utc).date().isoformat()


def _write_atomic(path: Path, data: dict) -> None:
    text = json.dumps(data, indent=2, ensure_ascii=False) + "\n"
    atomic_write_bytes(path, text.encode("utf-8"))


# _meta fields that must agree for a file to be resumed.
_RESUME_KEYS = ("dataset", "variant", "k", "provider", "model", "instruction", "request")


def _existing_entries(
    out: Path, meta: dict, classes: list[ClassSpec], force: bool, warn: bool = True
) -> dict:
    """Valid entries already in `out` (none with `force`); refuse files from another setup."""
    if force or not out.exists():
        return {}
    if out.is_dir():
        raise DescribeInputError(f"--out {out} is a folder, not a file")
    try:
        data = json.loads(out.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise DescribeInputError(
            f"{out} exists but is not valid JSON ({err}); use --force to overwrite it"
        ) from None
    old = data.get("_meta") if isinstance(data, dict) else None
    if not isinstance(old, dict):
        raise DescribeInputError(
            f"{out} exists but was not written by fedtsp describe (no _meta); "
            "use --force to overwrite it or choose another --out"
        )
    differ = [key for key in _RESUME_KEYS if old.get(key) != meta.get(key)]
    if differ:
        raise DescribeInputError(
            f"{out} was written with different settings ({', '.join(differ)}); "
            "use --force to regenerate it or choose another --out"
        )
    known = {c.key for c in classes}
    unknown = [key for key in data if not key.startswith("_") and key not in known]
    if unknown:
        raise DescribeInputError(
            f"{out} holds classes that are not in {meta['dataset']}: {unknown[:5]}; "
            "use --force to regenerate it or choose another --out"
        )
    kept = {}
    for spec in classes:
        if spec.key not in data:
            continue
        problem = entry_problem(data[spec.key], meta["k"])
        if problem:
            if warn:
                log.warning(
                    "class %r in %s is invalid (%s); regenerating it", spec.key, out, problem
                )
            continue
        kept[spec.key] = data[spec.key]
    return kept


def generate_descriptions(
    classes: Sequence[ClassSpec],
    client: ChatClient,
    out: str | Path,
    meta: dict,
    *,
    dataset_title: str,
    retries: int = 5,
    force: bool = False,
    progress: bool = True,
    secret: str | None = None,
) -> dict:
    """Describe every class not yet in `out`, rewriting `out` atomically after each one.

    `meta` must hold at least ``dataset``, ``variant`` and ``k``; it is written as ``_meta``
    (with ``date`` set to today). Returns the final file content. Raises `DescribeError` naming
    the class whose answers stayed malformed or whose requests kept failing; the classes done
    before it stay in the file. `secret` is masked in every message.
    """
    from tqdm import tqdm

    out = Path(out)
    classes = list(classes)
    k = int(meta["k"])
    variant = str(meta["variant"])
    entries = _existing_entries(out, meta, classes, force)
    todo = [c for c in classes if c.key not in entries]
    if entries:
        log.info("%s: %d of %d classes already described; %d to go",
                 out, len(entries), len(classes), len(todo))  # fmt: skip

    def content() -> dict:
        ordered = {c.key: entries[c.key] for c in classes if c.key in entries}
        return {"_meta": {**meta, "date": _today()}, **ordered}

    bar = tqdm(
        total=len(classes),
        initial=len(entries),
        desc=f"describe {meta['dataset']} ({variant})",
        unit="class",
        file=sys.stderr,
        disable=not progress,
    )
    try:
        for spec in todo:
            bar.set_postfix_str(spec.key[:30], refresh=False)
            messages = build_messages(spec, dataset_title, variant, k)
            entries[spec.key] = _ask(client, messages, spec, k, retries, secret)
            _write_atomic(out, content())
            bar.update(1)
    finally:
        bar.close()
    final = content()
    if not todo:
        _write_atomic(out, final)  # refresh _meta (e.g. the date) even with nothing to do
    return final


# --------------------------------------------------------------------------------------------
# Entry points
# --------------------------------------------------------------------------------------------


def _check_variant(variant: str) -> None:
    if variant not in VARIANTS:
        raise DescribeInputError(f"variant must be one of {', '.join(VARIANTS)}, got {variant!r}")


def _check_k(k: int) -> None:
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise DescribeInputError(f"k (descriptions per class) must be an integer >= 1, got {k!r}")


def describe(
    dataset: str,
    model: str,
    *,
    variant: str = "long",
    provider: str = "openai",
    base_url: str = DEFAULT_BASE_URL,
    out: str | Path | None = None,
    k: int = 3,
    timeout: float = 60.0,
    retries: int = 5,
    api_key_env: str = DEFAULT_API_KEY_ENV,
    wnids: str | Path | None = None,
    class_words: str | Path | None = None,
    force: bool = False,
    temperature: float | None = None,
    max_tokens: int | None = None,
    device: str = "auto",
    progress: bool = True,
    client: ChatClient | None = None,
) -> Path:
    """Write (or complete) the description file of `dataset`; returns its path.

    Every input is checked before the first request (`DescribeInputError`). `client` replaces
    the provider's client (for tests and custom back ends). Generation failures raise
    `DescribeError` naming the class.
    """
    _check_variant(variant)
    _check_k(k)
    if provider not in PROVIDERS:
        raise DescribeInputError(
            f"provider must be one of {', '.join(PROVIDERS)}, got {provider!r}"
        )
    if not isinstance(model, str) or not model.strip():
        raise DescribeInputError("--model must name a model (a model id or a local folder)")
    if not (isinstance(timeout, (int, float)) and math.isfinite(timeout) and timeout > 0):
        raise DescribeInputError(f"timeout must be a positive number of seconds, got {timeout!r}")
    if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
        raise DescribeInputError(f"retries must be an integer >= 0, got {retries!r}")
    if max_tokens is not None and max_tokens < 1:
        raise DescribeInputError(f"max tokens must be >= 1, got {max_tokens!r}")
    name, title, classes = resolve_classes(dataset, wnids=wnids, class_words=class_words)

    secret: str | None = None
    if provider == "openai":
        if not re.fullmatch(r"https?://[^\s]+", base_url or ""):
            raise DescribeInputError(f"--base-url must be an http(s) URL, got {base_url!r}")
        if not api_key_env or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", api_key_env):
            raise DescribeInputError(
                f"--api-key-env must name an environment variable, got {api_key_env!r}"
            )
        secret = os.environ.get(api_key_env, "").strip() or None
        if client is None and secret is None:
            raise DescribeInputError(
                f"environment variable {api_key_env} holds no API key; set it "
                "(the key is read only from the environment) or name another with --api-key-env"
            )
        model_id = model.strip()
        written_by = f"{model_id} via an OpenAI-compatible API ({_public_url(base_url)})"
        generation: dict[str, Any] = {"temperature": temperature, "max_tokens": max_tokens}
    else:
        model_id = Path(model).expanduser().name or model
        written_by = f"{model_id} (local transformers model, greedy decoding)"
        generation = {"decoding": "greedy", "max_new_tokens": max_tokens or 512}

    meta = {
        "dataset": name,
        "variant": variant,
        "k": k,
        "written_by": written_by,
        "provider": provider,
        "model": model_id,
        "date": _today(),
        "instruction": instruction_text(variant, k),
        "request": request_template(title),
        "generation": generation,
        "schema": SCHEMA,
    }
    out_path = Path(out).expanduser() if out is not None else Path(f"{name}_{variant}.json")
    # Refuse a foreign or incompatible file before loading a model or sending a request.
    _existing_entries(out_path, meta, classes, force, warn=False)

    if client is None:
        if provider == "openai":
            assert secret is not None
            client = OpenAIChat(model_id, secret, base_url, timeout, temperature, max_tokens)
        else:
            client = LocalChat(model, max_new_tokens=max_tokens or 512, device=device)
    generate_descriptions(
        classes,
        client,
        out_path,
        meta,
        dataset_title=title,
        retries=retries,
        force=force,
        progress=progress,
        secret=secret,
    )
    return out_path


def add_describe_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``describe`` command to an argparse sub-parser collection."""
    p = subparsers.add_parser(
        "describe",
        help="have a language model write the class descriptions (FedTSP prompts)",
        description=(
            "Ask a language model for k descriptions per class (appearance, function, "
            "environment) and write them in the authors' JSON schema. Resumable: rerunning "
            "the same command only asks for the classes missing from --out."
        ),
    )
    p.add_argument("--dataset", required=True, help="cifar10, cifar100, tinyimagenet or fmnist")
    p.add_argument("--variant", default="long", choices=VARIANTS, help="description length")
    p.add_argument("--provider", default="openai", choices=PROVIDERS)
    p.add_argument(
        "--model", required=True, help="model id (openai) or a local model folder (local)"
    )
    p.add_argument("--base-url", default=DEFAULT_BASE_URL, help="OpenAI-compatible API root")
    p.add_argument(
        "--api-key-env",
        default=DEFAULT_API_KEY_ENV,
        help="environment variable holding the API key (default OPENAI_API_KEY)",
    )
    p.add_argument("--out", default=None, help="output file (default ./<dataset>_<variant>.json)")
    p.add_argument("--k", type=int, default=3, help="descriptions per class (default 3)")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds per request")
    p.add_argument(
        "--retries", type=int, default=5, help="retries per class after the first attempt"
    )
    p.add_argument(
        "--wnids", default=None, help="Tiny-ImageNet: wnids.txt, or the dataset folder or .zip"
    )
    p.add_argument("--class-words", default=None, help="Tiny-ImageNet: words.txt (wnid<TAB>words)")
    p.add_argument(
        "--temperature",
        type=float,
        default=None,
        help="sampling temperature sent to the API (default: the server's)",
    )
    p.add_argument(
        "--max-tokens",
        type=int,
        default=None,
        help="answer length limit (openai: not sent by default; local: 512 new tokens)",
    )
    p.add_argument("--device", default="auto", help="local provider: cpu, cuda[:i] or auto")
    p.add_argument("--force", action="store_true", help="regenerate classes already in --out")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def run_describe(args: argparse.Namespace) -> int:
    """Run ``fedtsp describe``; returns the exit status (0 ok, 1 failed, 2 bad input)."""
    env = getattr(args, "api_key_env", DEFAULT_API_KEY_ENV) or DEFAULT_API_KEY_ENV
    secret = (os.environ.get(env, "").strip() or None) if re.fullmatch(r"\w+", env) else None
    try:
        path = describe(
            args.dataset,
            args.model,
            variant=args.variant,
            provider=args.provider,
            base_url=args.base_url,
            out=args.out,
            k=args.k,
            timeout=args.timeout,
            retries=args.retries,
            api_key_env=env,
            wnids=args.wnids,
            class_words=args.class_words,
            force=args.force,
            temperature=args.temperature,
            max_tokens=args.max_tokens,
            device=args.device,
            progress=not args.no_progress,
        )
    except DescribeInputError as exc:
        if getattr(args, "debug", False) or debug_requested():
            raise
        print(f"fedtsp: error: {_mask(one_line(exc), secret)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except DescribeError as exc:
        print(f"fedtsp describe: error: {_mask(str(exc), secret)}", file=sys.stderr)
        print(
            "fedtsp describe: the classes done so far are kept; rerun the same command to continue",
            file=sys.stderr,
        )
        return EXIT_FAILED
    except KeyboardInterrupt:
        print("fedtsp describe: interrupted; rerun the same command to continue", file=sys.stderr)
        return 130
    data = json.loads(path.read_text(encoding="utf-8"))
    n = sum(1 for key in data if not key.startswith("_"))
    print(f"wrote {n} classes ({args.variant}, k={args.k}) to {path}")
    return 0

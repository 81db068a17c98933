"""Asking class by class: retries with backoff, resuming from a partial file, atomic writes."""

from __future__ import annotations

import json
import logging
import random
import sys
import time
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path

from fedtsp.core.atomic import atomic_write_bytes
from fedtsp.text.describe.errors import (
    DescribeError,
    DescribeInputError,
    MalformedAnswer,
    ProviderError,
    TransientError,
)
from fedtsp.text.describe.prompts import (
    ClassSpec,
    build_messages,
    entry_problem,
    parse_answer,
    snippet,
)
from fedtsp.text.describe.providers import MAX_RETRY_AFTER_S, ChatClient, mask_secret

log = logging.getLogger(__name__)

BACKOFF_BASE_S = 1.0
BACKOFF_CAP_S = 60.0


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
            last = mask_secret(str(err), secret)
            if attempt + 1 >= tries:
                break
            delay = backoff_delay(attempt, err.retry_after)
            log.warning(
                "class %r: %s; retrying in %.1f s (attempt %d of %d)",
                spec.key, last, delay, attempt + 2, tries,
            )  # fmt: skip
            _sleep(delay)
        except MalformedAnswer as err:
            reason = mask_secret(str(err), secret)
            last = (
                reason
                if text is None
                else f"{reason}; answer: {snippet(mask_secret(text, secret))}"
            )
            if attempt + 1 < tries:
                log.warning(
                    "class %r: malformed answer (%s); asking again (attempt %d of %d)",
                    spec.key, reason, attempt + 2, tries,
                )  # fmt: skip
        except ProviderError as err:
            raise DescribeError(f"class {spec.key!r}: {mask_secret(str(err), secret)}") from None
    raise DescribeError(
        f"class {spec.key!r} ({spec.name}): no valid answer after {tries} attempt"
        f"{'s' if tries != 1 else ''}; last problem: {last}"
    )


def today() -> str:
    return datetime.now(timezone.utc).date().isoformat()


def _write_atomic(path: Path, data: dict) -> None:
    text = json.dumps(data, indent=2, ensure_ascii=False) + "\n"
    atomic_write_bytes(path, text.encode("utf-8"))


# _meta fields that must agree for a file to be resumed.
_RESUME_KEYS = ("dataset", "variant", "k", "provider", "model", "instruction", "request")


def existing_entries(
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
    entries = existing_entries(out, meta, classes, force)
    todo = [c for c in classes if c.key not in entries]
    if entries:
        log.info("%s: %d of %d classes already described; %d to go",
                 out, len(entries), len(classes), len(todo))  # fmt: skip

    def content() -> dict:
        ordered = {c.key: entries[c.key] for c in classes if c.key in entries}
        return {"_meta": {**meta, "date": today()}, **ordered}

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

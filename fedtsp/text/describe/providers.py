"""The two chat back ends: an OpenAI-compatible HTTP endpoint (standard library only) and a local
transformers model."""

from __future__ import annotations

import email.utils
import http.client
import json
import logging
import math
import re
import urllib.error
import urllib.parse
import urllib.request
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Protocol

from fedtsp.text.describe.errors import (
    DescribeInputError,
    MalformedAnswer,
    ProviderError,
    TransientError,
)
from fedtsp.text.describe.prompts import snippet

log = logging.getLogger(__name__)

PROVIDERS = ("openai", "local")
DEFAULT_BASE_URL = "https://api.openai.com/v1"
DEFAULT_API_KEY_ENV = "OPENAI_API_KEY"

# HTTP statuses worth retrying besides 5xx: timeout, conflict, too early, rate limit.
RETRY_STATUSES = frozenset({408, 409, 425, 429})
MAX_RETRY_AFTER_S = 600.0


class ChatClient(Protocol):
    """Anything that turns chat messages into the model's answer text."""

    def complete(self, messages: list[dict]) -> str: ...


def mask_secret(text: str, secret: str | None) -> str:
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


def public_url(url: str) -> str:
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
        return f"OpenAIChat(model={self.model!r}, base_url={public_url(self.base_url)!r})"

    def _safe(self, text: str) -> str:
        return mask_secret(text, self._key)

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
                f"cannot reach {public_url(self.url)} ({self._safe(err.reason)})"
            ) from None
        except (OSError, http.client.HTTPException) as err:
            raise TransientError(
                f"connection to {public_url(self.url)} failed ({type(err).__name__}: "
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
        return f": {snippet(message)}" if message else ""

    def _content(self, raw: bytes) -> str:
        text = raw.decode("utf-8", "replace")
        try:
            data = json.loads(text)
            content = data["choices"][0]["message"]["content"]
        except (json.JSONDecodeError, KeyError, IndexError, TypeError):
            raise MalformedAnswer(
                f"the response is not a chat completion: {snippet(self._safe(text))}"
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

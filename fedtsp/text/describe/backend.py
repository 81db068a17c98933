"""Which language model writes the descriptions, and how to reach it: one checked value."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedtsp.core import environment
from fedtsp.text.describe.errors import DescribeInputError
from fedtsp.text.describe.providers import (
    DEFAULT_API_KEY_ENV,
    DEFAULT_BASE_URL,
    PROVIDERS,
    ChatClient,
    LocalChat,
    OpenAIChat,
    public_url,
)

LOCAL_MAX_NEW_TOKENS = 512


@dataclass(frozen=True)
class Backend:
    """A model (an API model id, or a local transformers folder) and its request settings."""

    model: str
    provider: str = "openai"  # openai (any OpenAI-compatible API) or local
    base_url: str = DEFAULT_BASE_URL
    api_key_env: str = DEFAULT_API_KEY_ENV  # the key is read from this variable only
    timeout: float = 60.0  # seconds per request
    retries: int = 5  # per class, after the first attempt
    temperature: float | None = None  # None: the server's default
    max_tokens: int | None = None  # openai: not sent when None; local: 512 new tokens
    device: str = "auto"  # local: cpu, cuda[:i] or auto

    def check(self) -> None:
        """Every setting on its own (one `DescribeInputError`), before any request."""
        if self.provider not in PROVIDERS:
            raise DescribeInputError(
                f"provider must be one of {', '.join(PROVIDERS)}, got {self.provider!r}"
            )
        if not isinstance(self.model, str) or not self.model.strip():
            raise DescribeInputError("--model must name a model (a model id or a local folder)")
        timeout = self.timeout
        if not (isinstance(timeout, (int, float)) and math.isfinite(timeout) and timeout > 0):
            raise DescribeInputError(
                f"timeout must be a positive number of seconds, got {timeout!r}"
            )
        retries = self.retries
        if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
            raise DescribeInputError(f"retries must be an integer >= 0, got {retries!r}")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise DescribeInputError(f"max tokens must be >= 1, got {self.max_tokens!r}")
        if not re.fullmatch(r"auto|cpu|cuda(:\d+)?", str(self.device)):
            raise DescribeInputError(f"--device must be cpu, cuda[:i] or auto, got {self.device!r}")
        temperature = self.temperature
        if temperature is not None and not (math.isfinite(temperature) and temperature >= 0):
            raise DescribeInputError(
                f"--temperature must be a number >= 0 (or left out), got {temperature!r}"
            )
        if self.provider == "openai":
            if not re.fullmatch(r"https?://[^\s]+", self.base_url or ""):
                raise DescribeInputError(
                    f"--base-url must be an http(s) URL, got {self.base_url!r}"
                )
            if not self.api_key_env or not re.fullmatch(
                r"[A-Za-z_][A-Za-z0-9_]*", self.api_key_env
            ):
                raise DescribeInputError(
                    f"--api-key-env must name an environment variable, got {self.api_key_env!r}"
                )

    def secret(self) -> str | None:
        """The API key from the environment (None for a local model or when unset)."""
        return environment.secret(self.api_key_env) if self.provider == "openai" else None

    @property
    def model_id(self) -> str:
        if self.provider == "openai":
            return self.model.strip()
        return Path(self.model).expanduser().name or self.model

    def provenance(self) -> dict[str, Any]:
        """What a description file's ``_meta`` records of who wrote it and how."""
        if self.provider == "openai":
            where = f"OpenAI-compatible API ({public_url(self.base_url)})"
            generation = {"temperature": self.temperature, "max_tokens": self.max_tokens}
            return {"written_by": f"{self.model_id} via an {where}", "generation": generation}
        return {
            "written_by": f"{self.model_id} (local transformers model, greedy decoding)",
            "generation": {
                "decoding": "greedy",
                "max_new_tokens": self.max_tokens or LOCAL_MAX_NEW_TOKENS,
            },
        }

    def client(self, secret: str | None) -> ChatClient:
        if self.provider == "openai":
            assert secret is not None
            return OpenAIChat(
                self.model_id,
                secret,
                self.base_url,
                self.timeout,
                self.temperature,
                self.max_tokens,
            )
        return LocalChat(
            self.model, max_new_tokens=self.max_tokens or LOCAL_MAX_NEW_TOKENS, device=self.device
        )

"""What can go wrong in `fedtsp describe`: bad input, a failed class, a provider's failures."""

from __future__ import annotations

from fedtsp.core.errors import UserError


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

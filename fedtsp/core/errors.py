"""The one base class of every error caused by something a user gave the package.

Flags, config values, profile names, data paths and archives, description files, model
weights, export targets, run stores and checkpoints: when one of them cannot be used, the
package raises a subclass of `UserError` whose message is one sentence naming the value and
what is allowed. The CLI prints it as `fedtsp: error: <sentence>` (exit status 2, no
traceback unless `--debug` or FEDTSP_DEBUG=1), and `fedtsp.paper.notebook.short_errors()` does the
same in a notebook. Anything else that escapes is a bug and keeps its traceback.
"""

from __future__ import annotations


class UserError(Exception):
    """Something the user gave cannot be used; the message says what and what is allowed."""


class RunFailedError(Exception):
    """A run started and could not finish (a NaN loss, a client that stopped answering);
    the CLI prints it as one line with exit status 1."""


def one_line(exc: BaseException) -> str:
    """The error's message on one line (a multi-line message is joined with '; ')."""
    text = "; ".join(line.strip() for line in str(exc).splitlines() if line.strip())
    return text or type(exc).__name__

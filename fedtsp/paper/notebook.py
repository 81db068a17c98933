"""Notebook conveniences: user errors as one sentence instead of screens of frames.

Each numbered notebook calls `short_errors()` in its first code cell. A `UserError` raised
in a later cell (a missing dataset, a bad parameter, unavailable weights) then shows as
`fedtsp: error: <sentence>`, the cell still fails (so papermill and the batch runner see
the failure), and FEDTSP_DEBUG=1 brings the full traceback back.
"""

from __future__ import annotations

from typing import Any

from fedtsp.core.environment import debug_requested
from fedtsp.core.errors import UserError, one_line


def _show_user_error(shell: Any, etype: type, value: BaseException, tb: Any, tb_offset=None):
    if debug_requested():
        stb = shell.InteractiveTB.structured_traceback(etype, value, tb, tb_offset=tb_offset)
    else:
        stb = [f"fedtsp: error: {one_line(value)}"]
    # IPython does not display what a custom handler returns; _showtraceback is what its
    # kernel overrides to send the cell's error output.
    shell._showtraceback(etype, value, stb)
    return stb


def short_errors() -> bool:
    """Show `UserError`s in this IPython session as one line; False outside IPython."""
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    if shell is None:
        return False
    shell.set_custom_exc((UserError,), _show_user_error)
    return True

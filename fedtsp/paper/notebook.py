"""The numbered notebooks: where they are, which ones `--only` picks, and their user errors
as one sentence instead of screens of frames.

Each numbered notebook calls `short_errors()` in its first code cell. A `UserError` raised
in a later cell (a missing dataset, a bad parameter, unavailable weights) then shows as
`fedtsp: error: <sentence>`, the cell still fails (so papermill and the batch runner see
the failure), and FEDTSP_DEBUG=1 brings the full traceback back.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fedtsp.core.config import ConfigError
from fedtsp.core.environment import debug_requested
from fedtsp.core.errors import UserError, one_line

NOTEBOOKS_DIR = Path(__file__).resolve().parents[2] / "notebooks"


def find_notebooks(notebooks_dir: Path, only: list[str] | None = None) -> list[Path]:
    """Numbered notebooks (`NN_name.ipynb`), optionally only those whose name starts with `only`."""
    found = sorted(p for p in notebooks_dir.glob("[0-9][0-9]_*.ipynb"))
    if not found:
        raise ConfigError(f"no numbered notebooks (NN_name.ipynb) in {notebooks_dir}")
    if only:
        unknown = [o for o in only if not any(p.stem.startswith(o) for p in found)]
        if unknown:
            raise ConfigError(
                f"--only {' '.join(unknown)} matches no notebook; have: "
                f"{', '.join(p.stem for p in found)}"
            )
        found = [p for p in found if any(p.stem.startswith(o) for o in only)]
    return found


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

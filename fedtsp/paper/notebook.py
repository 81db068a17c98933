"""The numbered notebooks: where they are, which ones `--only` picks, their set-up, and their
user errors as one sentence instead of screens of frames.

Each numbered notebook's set-up cell is `nb = open_notebook(...)`: its parameters, data and
results writer, and `short_errors()`. A `UserError` raised in a later cell (a missing dataset, a bad parameter, unavailable weights) then shows as
`fedtsp: error: <sentence>`, the cell still fails (so papermill and the batch runner see
the failure), and FEDTSP_DEBUG=1 brings the full traceback back.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fedtsp.core import isa
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


class Notebook:
    """What a numbered notebook's set-up cell gives its other cells: each value of its
    profile as an attribute (`nb.seeds`, `nb.methods`, ...; `fedtsp.paper.profiles`), the
    data (`nb.source`), the writer of its tables and figures (`nb.writer`) and the profile's
    analysis plan (`nb.plan`: None where it has none, and the claims then compare with the
    strongest rival)."""

    def __init__(
        self, name: str, params: dict[str, Any], source: Any, writer: Any, plan: Any = None
    ) -> None:
        self.name, self.params, self.source, self.writer = name, params, source, writer
        self.plan = plan

    def runs(self) -> list[Any]:
        """The runs this notebook needs at its profile, exactly as `fedtsp reproduce` plans
        them: under an analysis plan, each group of runs with the plan's seeds only."""
        from fedtsp.paper.notebook_runs import notebook_plan

        return notebook_plan(self.name, self.params, self.source)

    def __getattr__(self, key: str) -> Any:
        try:
            return self.__dict__["params"][key]
        except KeyError:
            raise AttributeError(
                f"notebook {self.__dict__.get('name')} has no parameter {key!r}"
            ) from None


def open_notebook(
    name: str, profile: str, results_root: str, overrides: dict[str, Any] | None = None
) -> Notebook:
    """The set-up of notebook `name` at `profile`: its parameters (run store and results under
    `results_root`, given relative to the notebook's folder), its data source and results
    writer; user errors as one line from here on. Prints the profile and where the data and
    runs come from."""
    # Imported here: the command line imports this module for `find_notebooks` alone.
    from fedtsp.paper.claims.analysis_plan import load_plan
    from fedtsp.paper.experiments import DataSource
    from fedtsp.paper.outputs import ResultsWriter
    from fedtsp.paper.profiles import notebook_parameters

    params = notebook_parameters(profile, name, results_root, relative_to=".", overrides=overrides)
    source = DataSource(params["data"], params["synthetic_per_class"])
    writer = ResultsWriter(
        params["results_dir"],
        name,
        profile,
        params["about"],
        planned=params["planned_skips"],
        show=True,
    )
    short_errors()
    print(f"profile {profile}: {params['about'] or '(custom parameters)'}")
    print(f"data: {source.data or 'cache / torchvision download'}; run store: {params['store']}")
    kernels = isa.state()
    if not kernels.pinned:  # (pinned, the default, goes without saying)
        why = f"{isa.CHOICE}={kernels.requested}"
        if kernels.loaded_before:
            why = f"{' and '.join(kernels.loaded_before)} imported before fedtsp; restart the "
            why += "kernel and import fedtsp first to pin them"
        print(f"CPU kernels not pinned ({why}): runs made here are checkable only on like CPUs")
    writer.unplanned = unplanned_groups(name, params, source)
    if writer.unplanned:
        print(
            f"analysis plan: {len(writer.unplanned)} groups of this notebook's runs are not run "
            f"here (no planned claim part needs them), so their rows are absent: "
            + "; ".join(writer.unplanned)
        )
    return Notebook(name, params, source, writer, load_plan(profile))


def unplanned_groups(name: str, params: dict[str, Any], source: Any) -> list[str]:
    """The labels of the notebook's groups of runs its profile's analysis plan gives no
    seeds (none without a plan)."""
    from fedtsp.paper.experiments import seed_group
    from fedtsp.paper.notebook_runs import notebook_plan

    if params.get("plan_seeds") is None:
        return []
    kept = {seed_group(s.config) for s in notebook_plan(name, params, source)}
    every = notebook_plan(name, {**params, "plan_seeds": None}, source)
    left = [s for s in every if seed_group(s.config) not in kept]
    return list(dict.fromkeys(", ".join(str(v) for v in s.labels.values()) for s in left))

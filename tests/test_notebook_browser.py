"""What a reader sees: every notebook opened in JupyterLab in headless Chromium and run top
to bottom against the committed cpu run store (a scratch copy): no error output, every
code cell executed, tables rendered, as many figures as the batch run produced, and no
run started."""

from __future__ import annotations

import importlib.util
import json
import sys

import pytest
from conftest import REPO

_spec = importlib.util.spec_from_file_location(
    "notebook_browser", REPO / "tools" / "notebook_browser.py"
)
browser = importlib.util.module_from_spec(_spec)
sys.modules["notebook_browser"] = browser  # its dataclasses look their module up
_spec.loader.exec_module(browser)

NOTEBOOKS = sorted(p.stem for p in (REPO / "notebooks").glob("[0-9][0-9]_*.ipynb"))
PROBLEM = browser.browser_problem()
pytestmark = pytest.mark.skipif(PROBLEM is not None, reason=f"no browser check: {PROBLEM}")


@pytest.fixture(scope="module")
def page():
    lab = browser.Lab()
    driver = browser.browser()
    yield lab, driver
    driver.quit()
    lab.close()


def _batch_figures(name: str) -> int:
    """Figures in the executed copy the batch run committed (papermill_runs/cpu)."""
    cells = json.loads((REPO / "papermill_runs" / "cpu" / f"{name}.ipynb").read_text())["cells"]
    return sum("image/png" in out.get("data", {}) for c in cells for out in c.get("outputs", []))


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_a_notebook_runs_in_jupyterlab_as_a_reader_sees_it(page, name):
    lab, driver = page
    before = lab.store_state()
    report = browser.run_notebook(driver, lab, name)
    browser.shut_down_kernel(driver)
    assert report.errors == []
    assert report.executed == report.code_cells > 0
    assert report.tables >= 1
    assert report.figures == _batch_figures(name)
    assert lab.store_state() == before  # every run came from the store

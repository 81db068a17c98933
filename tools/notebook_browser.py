"""Open the notebooks in JupyterLab in a real browser, run all their cells, and report what
a reader sees.

    python tools/notebook_browser.py [NN ...] [--screenshots docs/screenshots]

Starts JupyterLab on loopback over a scratch folder holding a copy of the notebooks and of
the committed cpu run store (so the repository's files are only read), drives the system
Chromium headless with selenium (Debian's `chromium` and `chromium-driver`; no browser is
downloaded), opens each notebook, runs all its cells with JupyterLab's own "Run All
Cells" command, and reads the page: code cells executed, error outputs, rendered tables
and figures. `tests/test_notebook_browser.py` asserts on the same report; with
`--screenshots` a PNG of each notebook's first figure, as the page shows it, is saved.
"""

from __future__ import annotations

import argparse
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
CHROMIUM = ("chromium", "chromium-browser", "google-chrome")
DRIVER = ("chromedriver",)
WINDOW = (1280, 1600)


def _first(names: tuple[str, ...]) -> str | None:
    """The first of `names` found on PATH."""
    return next((found for n in names if (found := shutil.which(n))), None)


def browser_problem() -> str | None:
    """Why the browser check cannot run here (None when it can)."""
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install -e '.[dev]')"
    if _first(CHROMIUM) is None or _first(DRIVER) is None:
        return (
            "no system Chromium and chromedriver (Debian: apt-get install chromium "
            "chromium-driver; scripts/setup.sh installs them where apt is usable)"
        )
    return None


@dataclass
class PageReport:
    """What the page showed after running all cells."""

    notebook: str
    open_seconds: float
    run_seconds: float
    code_cells: int
    executed: int
    errors: list[str] = field(default_factory=list)
    tables: int = 0
    figures: int = 0


class Lab:
    """JupyterLab on loopback over a scratch copy of the notebooks and the cpu run store."""

    def __init__(self, profile: str = "cpu") -> None:
        self.root = Path(tempfile.mkdtemp(prefix="fedtsp-lab-"))
        shutil.copytree(REPO / "notebooks", self.root / "notebooks", ignore=_not_notebooks)
        store = self.root / "results" / profile / "runs"
        shutil.copytree(REPO / "results" / profile / "runs", store)
        self.store = store
        self.token = secrets.token_hex(16)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        # JupyterLab's own settings: no "get notified about news?" prompt over the page.
        settings = self.root / ".settings" / "@jupyterlab" / "apputils-extension"
        settings.mkdir(parents=True)
        (settings / "notification.jupyterlab-settings").write_text('{"fetchNews": "false"}')
        env = {
            **os.environ,
            "JUPYTER_CONFIG_DIR": str(self.root / ".jupyter"),  # no user settings
            "JUPYTER_RUNTIME_DIR": str(self.root / ".runtime"),
        }
        self.process = subprocess.Popen(
            [
                sys.executable, "-m", "jupyterlab", "--no-browser", "--expose-app-in-browser",
                f"--ServerApp.port={self.port}", "--ServerApp.ip=127.0.0.1",
                f"--IdentityProvider.token={self.token}", f"--ServerApp.root_dir={self.root}",
                "--ServerApp.port_retries=0", "--LabApp.news_url=",
                "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
                "--LabApp.extension_manager=readonly",  # no package index queries
                f"--LabApp.user_settings_dir={self.root / '.settings'}",
                *(["--allow-root"] if os.geteuid() == 0 else []),
            ],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + 120
        while True:
            try:
                status = f"{self.url}/api/status?token={self.token}"
                with urllib.request.urlopen(status, timeout=2) as reply:  # noqa: S310 (loopback)
                    if reply.status == 200:
                        break
            except OSError:
                pass
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise RuntimeError("JupyterLab did not start on loopback within 120 s")
            time.sleep(0.5)

    def store_state(self) -> dict[str, int]:
        """Each file of the scratch run store with its modification time."""
        return {p.name: p.stat().st_mtime_ns for p in self.store.rglob("*") if p.is_file()}

    def close(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
        shutil.rmtree(self.root, ignore_errors=True)


def _not_notebooks(folder: str, names: list[str]) -> list[str]:
    return [n for n in names if not n.endswith(".ipynb") and n != "README.md"]


def browser() -> Any:
    """Headless Chromium driven by selenium, with the system browser and driver."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = _first(CHROMIUM)
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"):
        options.add_argument(flag)
    options.add_argument(f"--window-size={WINDOW[0]},{WINDOW[1]}")
    return webdriver.Chrome(options=options, service=Service(_first(DRIVER)))


# Reads the open notebook: cells, execution counts, error outputs, rendered tables and figures.
_READ_PAGE = """
const panel = window.jupyterapp.shell.currentWidget.node;
const code = [...panel.querySelectorAll('.jp-CodeCell')];
const prompts = code.map(c => (c.querySelector('.jp-InputPrompt') || {}).textContent || '');
return {
  code: code.length,
  executed: prompts.filter(p => /\\[\\d+\\]/.test(p)).length,
  busy: prompts.filter(p => p.includes('*')).length,
  errors: [...panel.querySelectorAll('[data-mime-type="application/vnd.jupyter.error"]')]
    .map(e => e.textContent.slice(0, 300)),
  tables: panel.querySelectorAll('.jp-OutputArea-output table').length,
  figures: panel.querySelectorAll('.jp-OutputArea-output img').length,
};
"""

_RUN_ALL = """
const done = arguments[arguments.length - 1];
const app = window.jupyterapp;
const panel = app.shell.currentWidget;
panel.sessionContext.ready
  .then(() => app.commands.execute('notebook:run-all-cells'))
  .then(() => done('ok'), e => done('error: ' + e));
"""


def run_notebook(driver: Any, lab: Lab, name: str, timeout: float = 600.0) -> PageReport:
    """Open notebook `name` in JupyterLab, run all its cells, and read the page."""
    from selenium.webdriver.support.ui import WebDriverWait

    start = time.monotonic()
    # A workspace of its own, reset: only this notebook open, whatever ran before.
    path = f"notebooks/{name}.ipynb"
    driver.get(f"{lab.url}/lab/workspaces/{name}/tree/{path}?reset&token={lab.token}")
    opened = (
        "const w = window.jupyterapp && window.jupyterapp.shell.currentWidget;"
        f"return !!(w && w.context && w.context.path === '{path}' && w.sessionContext"
        " && w.node.querySelector('.jp-CodeCell'));"
    )
    WebDriverWait(driver, 120).until(lambda d: d.execute_script(opened))
    opened_at = time.monotonic()
    driver.set_script_timeout(timeout)
    outcome = driver.execute_async_script(_RUN_ALL)
    if outcome != "ok":
        raise RuntimeError(f"{name}: Run All Cells failed: {outcome}")
    WebDriverWait(driver, timeout).until(lambda d: d.execute_script(_READ_PAGE)["busy"] == 0)
    page = driver.execute_script(_READ_PAGE)
    return PageReport(
        notebook=name,
        open_seconds=opened_at - start,
        run_seconds=time.monotonic() - opened_at,
        code_cells=page["code"],
        executed=page["executed"],
        errors=page["errors"],
        tables=page["tables"],
        figures=page["figures"],
    )


def shut_down_kernel(driver: Any) -> None:
    """Stop the open notebook's kernel (each notebook runs in its own, one at a time)."""
    driver.execute_script("return window.jupyterapp.shell.currentWidget.sessionContext.shutdown()")


def screenshot(driver: Any, path: Path) -> None:
    """The page with the notebook's first figure scrolled into view, as a PNG."""
    driver.execute_script(
        "const img = window.jupyterapp.shell.currentWidget.node"
        ".querySelector('.jp-OutputArea-output img');"
        "if (img) img.scrollIntoView({block: 'center'});"
    )
    time.sleep(1.0)  # let the scroll and the image settle
    path.parent.mkdir(parents=True, exist_ok=True)
    driver.save_screenshot(str(path))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("only", nargs="*", help="notebook prefixes (default: all)")
    parser.add_argument("--screenshots", help="folder for one PNG per notebook")
    args = parser.parse_args(argv)
    problem = browser_problem()
    if problem:
        print(f"cannot run the browser check: {problem}", file=sys.stderr)
        return 2
    names = sorted(
        p.stem
        for p in (REPO / "notebooks").glob("[0-9][0-9]_*.ipynb")
        if not args.only or p.stem.startswith(tuple(args.only))
    )
    lab = Lab()
    driver = browser()
    failed = 0
    try:
        for name in names:
            report = run_notebook(driver, lab, name)
            ok = not report.errors and report.executed == report.code_cells
            failed += not ok
            print(
                f"{name}: opened in {report.open_seconds:.1f} s, ran in "
                f"{report.run_seconds:.1f} s; {report.executed} of {report.code_cells} code "
                f"cells executed, {len(report.errors)} errors, {report.tables} tables, "
                f"{report.figures} figures"
            )
            if args.screenshots:
                screenshot(driver, Path(args.screenshots) / f"{name}.png")
            shut_down_kernel(driver)
    finally:
        driver.quit()
        lab.close()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

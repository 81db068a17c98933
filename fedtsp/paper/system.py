"""System data and tools the package needs beyond Python packages: WordNet 3.0,
Fashion-MNIST, and Chromium with its driver for the notebook browser test.

`python -m fedtsp.paper.system` prints what is present and what is missing; `--debian` prints only
the Debian packages that would supply what is missing (what `scripts/setup.sh` installs).
Each check accepts every route the package itself reads: for WordNet an nltk corpus,
`$WNSEARCHDIR` or the Debian files; for Fashion-MNIST `$FEDTSP_DATA`, the Debian folder or
an earlier decoded copy in the cache; for the browser, `chromium` and `chromedriver` on the
PATH (Debian: chromium, chromium-driver).
"""

from __future__ import annotations

import argparse
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class SystemData:
    name: str
    needed_for: str
    debian: tuple[str, ...]
    other_route: str
    problem: Callable[[], str | None]  # None when usable, else why not
    dataset: str | None = None  # the registered dataset it supplies, if any

    def install_hint(self) -> str:
        return (
            f"{self.name} ({self.needed_for}) is missing: install the Debian package(s) "
            f"{' '.join(self.debian)} (`sudo apt-get install {' '.join(self.debian)}`), "
            f"or {self.other_route}"
        )


def _wordnet_problem() -> str | None:
    from fedtsp.paper.semantics import WordNetUnavailableError, wordnet

    try:
        wordnet()
    except WordNetUnavailableError as exc:
        return str(exc)
    return None


def _fmnist_problem() -> str | None:
    from fedtsp.data import DatasetNotFoundError, load_dataset

    try:
        load_dataset("fmnist", download=False)
    except DatasetNotFoundError as exc:
        return str(exc)
    return None


def _browser_problem() -> str | None:
    lacking = [name for name in ("chromium", "chromedriver") if shutil.which(name) is None]
    return f"not found on PATH: {', '.join(lacking)}" if lacking else None


SYSTEM_DATA = (
    SystemData(
        "WordNet 3.0",
        "the prototype-semantics metrics, notebook 02",
        ("wordnet-base", "wordnet-sense-index"),
        "with internet run `python -c \"import nltk; nltk.download('wordnet')\"`.",
        _wordnet_problem,
    ),
    SystemData(
        "Fashion-MNIST",
        "the FMCL mixed-domain population, notebook 08",
        ("dataset-fashion-mnist",),
        "with internet let torchvision download FashionMNIST and point FEDTSP_DATA at its folder.",
        _fmnist_problem,
        dataset="fmnist",
    ),
    SystemData(
        "Chromium",
        "the test that opens every notebook in JupyterLab (tests/test_notebook_browser.py)",
        ("chromium", "chromium-driver"),
        "the test is skipped with its reason.",
        _browser_problem,
    ),
)


def dataset_hint(name: str) -> str | None:
    """How to install registered dataset `name` when it is system data, else None."""
    return next((item.install_hint() for item in SYSTEM_DATA if item.dataset == name), None)


def missing() -> list[SystemData]:
    """The system data this machine lacks."""
    return [item for item in SYSTEM_DATA if item.problem() is not None]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fedtsp.paper.system", description=__doc__)
    parser.add_argument(
        "--debian", action="store_true", help="print only the Debian packages for what is missing"
    )
    args = parser.parse_args(argv)
    absent = missing()
    if args.debian:
        print(" ".join(pkg for item in absent for pkg in item.debian))
        return 0
    for item in SYSTEM_DATA:
        print(f"{item.name}: {'missing' if item in absent else 'ok'}")
    for item in absent:
        print(item.install_hint())
    return 1 if absent else 0


if __name__ == "__main__":
    sys.exit(main())

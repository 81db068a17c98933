"""Committed outputs hold no absolute path of the machine that produced them."""

from __future__ import annotations

import re
import subprocess

import pytest
from conftest import REPO

# An absolute path: a root folder that machines put checkouts, homes and caches under.
ABSOLUTE = re.compile(
    r"(?<![\w.~-])(/(?:home|root|work|tmp|Users|mnt|opt|srv|scratch|var|data)/[\w.-]+)"
    r"|\b[A-Z]:\\\\[\w.-]+"
)
TEXT_SUFFIXES = {".json", ".md", ".csv", ".tex", ".ipynb", ".txt", ".sh", ".py"}


def _committed_outputs() -> list[str]:
    try:
        done = subprocess.run(
            ["git", "ls-files", "results", "papermill_runs", "benchmarks"],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=30,
        )
    except OSError:
        pytest.skip("git is not available")
    if done.returncode != 0:
        pytest.skip("not a git checkout")
    return [f for f in done.stdout.splitlines() if f[f.rfind(".") :] in TEXT_SUFFIXES]


def test_the_pattern_catches_what_it_is_for():
    assert ABSOLUTE.search('"source": "/work/cpurun/shared/data/cifar10-jpg.tar.gz"')
    assert ABSOLUTE.search("PosixPath('/home/ann/fedtsp/core/results/cpu/figures/x.png')")
    assert ABSOLUTE.search("cache C:\\\\Users\\\\ann")
    assert not ABSOLUTE.search('"source": "../shared/data/cifar10-jpg.tar.gz"')
    assert not ABSOLUTE.search("https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz")
    assert not ABSOLUTE.search("~/.cache/fedtsp and ../results/cpu/runs")


def test_no_committed_output_holds_an_absolute_path():
    files = _committed_outputs()
    assert len(files) > 100  # the cpu outputs are committed
    found = {}
    for name in files:
        text = (REPO / name).read_text(encoding="utf-8", errors="replace")
        hits = {m.group(0) for m in ABSOLUTE.finditer(text)}
        if hits:
            found[name] = sorted(hits)[:3]
    assert found == {}

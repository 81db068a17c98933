"""System data checks (`python -m fedtsp.paper.system`) and the idempotent set-up script."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO

from fedtsp.paper import system
from fedtsp.paper.system import SystemData


def _fake(name: str, debian: tuple[str, ...], problem: str | None) -> SystemData:
    return SystemData(name, "a test", debian, "with internet fetch it.", lambda: problem)


def test_missing_items_name_their_packages_and_the_other_route(monkeypatch, capsys):
    items = (
        _fake("Present", ("pkg-present",), None),
        _fake("Absent", ("pkg-a", "pkg-b"), "not found in /nowhere"),
    )
    monkeypatch.setattr(system, "SYSTEM_DATA", items)
    assert [item.name for item in system.missing()] == ["Absent"]
    assert system.main(["--debian"]) == 0
    assert capsys.readouterr().out.split() == ["pkg-a", "pkg-b"]
    assert system.main([]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[:2] == ["Present: ok", "Absent: missing"]
    assert out[2] == (
        "Absent (a test) is missing: install the Debian package(s) pkg-a pkg-b "
        "(`sudo apt-get install pkg-a pkg-b`), or with internet fetch it."
    )


def test_fashion_mnist_hint_is_given_for_its_dataset_only():
    assert "dataset-fashion-mnist" in system.dataset_hint("fmnist")
    assert system.dataset_hint("cifar10") is None


def test_setup_is_idempotent_and_takes_seconds_when_all_is_there():
    venv = Path(sys.prefix)
    if not (venv / ".fedtsp-installed").is_file():
        pytest.skip("these tests do not run in a virtual environment made by scripts/setup.sh")
    env = {**os.environ, "FEDTSP_VENV": str(venv), "FEDTSP_NO_APT": "1"}
    start = time.perf_counter()
    done = subprocess.run(
        ["scripts/setup.sh"], cwd=REPO, env=env, capture_output=True, text=True, timeout=300
    )
    seconds = time.perf_counter() - start
    assert done.returncode == 0, done.stderr
    assert "installing" not in done.stdout  # nothing reinstalled
    assert done.stdout.strip().splitlines()[-1] == f"setup: ready ({venv})"
    assert seconds < 30, f"{seconds:.1f} s"

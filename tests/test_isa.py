"""The CPU kernels are pinned to AVX2 by default, recorded, honoured when the user chooses
others, refused when half set, and a checkpoint resumes only under the kernels it was made
with."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
import torch
from conftest import CIFAR10_ARCHIVE, REPO, tiny_config

from fedtsp.core import isa
from fedtsp.core.machine import cpu_class
from fedtsp.core.results import RunStoreError
from fedtsp.engine.simulation import run_experiment

PINS = (*isa.KERNEL_PINS, *isa.NUMPY_PINS, isa.CHOICE)
# Every pin and a setting of the user's own: DEFAULT (no vector kernels) is valid everywhere.
USER = {"ATEN_CPU_CAPABILITY": "default", "ONEDNN_MAX_CPU_ISA": "SSE41", "MKL_CBWR": "COMPATIBLE"}


def _python(code: str, env: dict[str, str], timeout: float = 240) -> subprocess.CompletedProcess:
    """``code`` in a fresh interpreter whose environment has no pins but ``env``."""
    clean = {k: v for k, v in os.environ.items() if k not in PINS} | env
    return subprocess.run(
        [sys.executable, "-c", code], env=clean, capture_output=True, text=True, cwd=REPO,
        timeout=timeout,
    )  # fmt: skip


def _fedtsp(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return _python(f"import sys; from fedtsp.cli import main; sys.exit(main({list(args)!r}))", env)


def test_this_test_process_runs_the_pinned_kernels():
    # conftest imports fedtsp before torch and NumPy: the suite runs what the records ran.
    assert isa.state().pinned and isa.state().requested == "avx2"
    assert str(torch.backends.cpu.get_cpu_capability()) == "AVX2"
    assert all(os.environ[k] == v for k, v in isa.KERNEL_PINS.items())


def test_a_record_names_its_kernels_and_the_versions_that_decide_its_bits(tmp_path, tiny_data):
    record = run_experiment(tiny_config(rounds=1), dataset=tiny_data, out=tmp_path, progress=False)
    env = record["environment"]
    assert env["isa"]["requested"] == "avx2" and env["isa"]["pinned"] is True
    assert env["isa"]["tag"] == "avx2 (pinned)"
    assert env["isa"]["effective"]["aten"] == "AVX2"
    assert env["isa"]["effective"]["numpy"] in ("X86_V3", "X86_V2")  # nothing above AVX2
    assert env["isa"]["settings"]["MKL_CBWR"] == "AVX2"
    assert env["versions"]["torch"] == torch.__version__.split("+")[0]
    assert set(env["versions"]) == {"torch", "mkl", "onednn", "numpy", "scipy", "scikit-learn"}
    assert all(env["versions"].values())  # each found
    assert env["cpu"] == cpu_class() and env["threads"] == 1
    # The record's kernels are what `verify` reruns it with: the pins, on any AVX2 machine.
    variables, where = isa.record_environment(env)
    assert where == isa.AVX2_MACHINES and variables["ATEN_CPU_CAPABILITY"] == "avx2"


def test_records_made_before_the_pins_rerun_with_the_kernels_of_their_class():
    avx2 = {"cpu": {"model": "AMD EPYC", "capability": "AVX2", "flags": ["avx2", "fma"]}}
    variables, where = isa.record_environment(avx2)
    assert where == isa.AVX2_MACHINES and variables["MKL_CBWR"] == "AVX2"
    xeon = {"model": "Intel(R) Xeon(R)", "capability": "AVX512", "flags": ["avx2", "avx512f"]}
    variables, where = isa.record_environment({"cpu": xeon})
    assert where == "only on Intel AVX512 (avx2, avx512f)"
    assert variables[isa.CHOICE] == "native" and variables["ATEN_CPU_CAPABILITY"] is None
    assert isa.record_environment({})[1] == "only on the CPU class that made it (not recorded)"


def test_a_resume_under_other_kernels_is_refused_in_one_line(tmp_path, tiny_data, monkeypatch):
    config = tiny_config(rounds=3)
    run_experiment(config, dataset=tiny_data, out=tmp_path, progress=False, stop_after=2)
    monkeypatch.setattr(isa, "tag", lambda: "native AVX512 (Intel)")
    with pytest.raises(RunStoreError, match=r"written with the CPU kernels avx2 \(pinned\)"):
        run_experiment(config, dataset=tiny_data, out=tmp_path, progress=False, resume=True)
    monkeypatch.undo()  # the same kernels resume it
    record = run_experiment(config, dataset=tiny_data, out=tmp_path, progress=False, resume=True)
    assert len(record["history"]) == 4


def test_a_partial_kernel_setting_is_refused_in_one_line_before_any_work():
    begin = time.perf_counter()
    result = _fedtsp("run", "--rounds", "1", env={"ATEN_CPU_CAPABILITY": "avx2"})
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "fedtsp: error: ATEN_CPU_CAPABILITY=avx2 pins only part of the CPU kernels; set all "
        "of ATEN_CPU_CAPABILITY, ONEDNN_MAX_CPU_ISA, MKL_CBWR (or none: fedtsp pins AVX2), or "
        "FEDTSP_ISA=native"
    )
    assert time.perf_counter() - begin < 15  # no data, no torch work
    result = _fedtsp("reproduce", "--profile", "smoke", env={"MKL_CBWR": "AVX2", "FEDTSP_ISA": ""})
    assert result.returncode == 2 and "MKL_CBWR=AVX2 pins only part" in result.stderr
    result = _fedtsp("run", env={isa.CHOICE: "avx9"})
    assert result.returncode == 2 and "FEDTSP_ISA='avx9' is invalid" in result.stderr


_RUN = """
import json, pathlib, sys
from fedtsp.cli import main
status = main({argv!r})
record = json.loads(next(pathlib.Path({out!r}).glob("*.json")).read_text())
print(json.dumps(record["environment"]["isa"]))
sys.exit(status)
"""
TINY = ["--num-clients", "4", "--fraction", "0.02", "--rounds", "1", "--batch-size", "20"]


@pytest.mark.skipif(not CIFAR10_ARCHIVE.exists(), reason="needs ../shared/data (CIFAR-10)")
@pytest.mark.parametrize(
    ("env", "flags", "requested", "aten"),
    [
        ({}, [], "avx2", "AVX2"),
        (USER, [], "user", "DEFAULT"),  # all three set by the user: their setting wins
        ({}, ["--isa", "native"], "native", cpu_class()["capability"]),
        (USER, ["--isa", "avx2"], "avx2", "AVX2"),  # the flag wins over the environment
    ],
)
def test_fedtsp_run_records_the_kernels_chosen(tmp_path, env, flags, requested, aten):
    argv = ["run", "--data", str(CIFAR10_ARCHIVE), "--out", str(tmp_path), *TINY, *flags]
    result = _python(_RUN.format(argv=argv + ["--no-progress"], out=str(tmp_path)), env)
    assert result.returncode == 0, result.stderr[-2000:]
    recorded = json.loads(result.stdout.strip().splitlines()[-1])
    assert recorded["requested"] == requested and recorded["effective"]["aten"] == aten
    assert recorded["pinned"] is (requested == "avx2")


def test_a_process_that_imported_torch_before_fedtsp_says_it_is_not_pinned():
    # The kernels are chosen at torch's first use of them: compute before fedtsp is imported.
    code = "import torch, json; (torch.ones(64) * 2).sum(); import fedtsp; from fedtsp.core "
    code += "import isa; print(json.dumps(isa.describe()))"
    result = _python(code, {})
    assert result.returncode == 0, result.stderr[-2000:]
    described = json.loads(result.stdout.strip().splitlines()[-1])
    assert described["pinned"] is False and described["tag"].startswith("native ")
    assert described["unpinned_because"].startswith("torch, numpy imported before fedtsp")
    assert described["effective"]["aten"] == cpu_class()["capability"]  # the machine's own

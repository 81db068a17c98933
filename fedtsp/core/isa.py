"""The instruction set the CPU kernels may use: pinned to AVX2 by default, so that a record's
bits do not depend on the machine that made it.

PyTorch's vectorised kernels, oneDNN's convolutions and MKL's BLAS each choose their code
path by the CPU's instruction set, and two paths sum in different orders: a run made on an
AVX-512 machine differs in its last bits from round 0 when rerun on an AVX2 one, and the
other way round. Each library reads its setting once (when it loads or first computes), so
the pins are set here, by ``import fedtsp``, before anything imports torch or NumPy:

- ``ATEN_CPU_CAPABILITY=avx2`` (PyTorch's own kernels), ``ONEDNN_MAX_CPU_ISA=AVX2``
  (oneDNN), ``MKL_CBWR=AVX2`` (MKL's conditional numerical reproducibility): the kernel
  pins. All three or none: one alone still differs from round 0 (measured, PROTOCOL.md);
- ``OPENBLAS_CORETYPE=Haswell`` and ``NPY_DISABLE_CPU_FEATURES`` (NumPy's and SciPy's
  OpenBLAS and NumPy's own loops, which compute PACFL's SVD, AlignFed's anchors, the
  clustering), each set only where the environment has not set it already.

``FEDTSP_ISA=native`` (or ``--isa native``) leaves every kernel at the machine's best; a
user who sets all three kernel pins themselves gets their setting ("user"); setting some of
them is refused by the commands that train (`refuse_partial`), since it pins nothing. Child
processes (workers, client processes, Flower's, Ray's) inherit the environment, so they run
the same kernels. CUDA kernels are not affected: a GPU run's CPU side is pinned, its GPU
side is whatever the GPU and cuDNN choose.

This module imports neither torch nor NumPy at module level: it must run before them.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from importlib import metadata
from typing import Any

from fedtsp.core.errors import UserError

CHOICE = "FEDTSP_ISA"
LEVELS = ("avx2", "native")
# The kernel pins: set together or not at all.
KERNEL_PINS = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_CBWR": "AVX2"}
# NumPy's dispatch targets above AVX2 (numpy >= 2.3 names; an unknown or unsupported name is
# ignored) and OpenBLAS's AVX2 kernel: set only where unset, since some machines set
# OPENBLAS_CORETYPE themselves.
NUMPY_PINS = {
    "OPENBLAS_CORETYPE": "Haswell",
    "NPY_DISABLE_CPU_FEATURES": "X86_V4 AVX512_SKX AVX512_CLX AVX512_CNL AVX512_ICL AVX512_SPR",
}
# What a record names among the versions that decide its bits (distribution names).
DISTRIBUTIONS = ("torch", "numpy", "scipy", "scikit-learn")
AVX2_MACHINES = "on any x86-64 machine with AVX2"


class IsaError(UserError):
    """A kernel setting that cannot be honoured (one line, for the command line)."""


@dataclass(frozen=True)
class State:
    """What this process asked for and what it got, fixed when fedtsp was first imported.

    ``requested``: "avx2" (the default pins), "native", "user" (all three kernel pins set by
    the user) or "partial" (some of them: refused by the commands that train);
    ``loaded_before``: torch / numpy modules already imported without the pins: each
    library fixes its kernels when it first loads or first computes, so they may run at the
    machine's own level whatever the environment says now (taken as not pinned).
    """

    requested: str
    loaded_before: tuple[str, ...]

    @property
    def pinned(self) -> bool:
        """Whether this process's kernels are the AVX2 pins (its bits checkable anywhere)."""
        if self.loaded_before or self.requested != "avx2":
            return False
        return all(os.environ.get(k, "").upper() == v.upper() for k, v in KERNEL_PINS.items())


_state: State | None = None
_set_here: set[str] = set()  # the NumPy pins this process added (a native rerun drops them)


def configure() -> State:
    """Set the pins in this process's environment (once; `import fedtsp` calls it)."""
    global _state
    if _state is not None:
        return _state
    choice = os.environ.get(CHOICE, "avx2").strip().lower() or "avx2"
    if choice not in LEVELS:
        choice = "invalid"  # refused by refuse_partial with the value named
    given = [k for k in KERNEL_PINS if os.environ.get(k)]
    loaded = tuple(m for m in ("torch", "numpy") if m in sys.modules)
    if choice == "native":
        _state = State("native", ())
        return _state
    if given and len(given) < len(KERNEL_PINS):
        _state = State("partial", ())
        return _state
    if given:  # all three were there when this process started: what loaded used them
        own = all(os.environ[k].upper() == v.upper() for k, v in KERNEL_PINS.items())
        _state = State("avx2" if own else "user", ())
    else:
        os.environ.update(KERNEL_PINS)
        _state = State(choice, loaded)
    for name, value in NUMPY_PINS.items():
        if not os.environ.get(name):
            os.environ[name] = value
            _set_here.add(name)
    return _state


def state() -> State:
    return configure()


def choose(level: str) -> None:
    """Run this process (and its children) at ``level`` ("avx2" or "native"), as ``--isa``
    asks: it wins over the environment, and only before torch or NumPy is imported."""
    global _state
    if level not in LEVELS:
        raise IsaError(f"--isa {level} is invalid; choose one of {', '.join(LEVELS)}")
    loaded = [m for m in ("torch", "numpy") if m in sys.modules]
    if loaded:
        raise IsaError(
            f"--isa {level} must be chosen before {' and '.join(loaded)} is imported; set "
            f"{CHOICE}={level} in the environment instead"
        )
    _apply(level_variables(level))
    _state = State(level, ())


def refuse_partial() -> None:
    """One line, before any work, where the kernel setting pins nothing it could record."""
    choice = os.environ.get(CHOICE, "")
    if choice and choice.strip().lower() not in LEVELS:
        raise IsaError(f"{CHOICE}={choice!r} is invalid; choose one of {', '.join(LEVELS)}")
    current = state()
    if current.requested == "partial":
        given = ", ".join(f"{k}={os.environ[k]}" for k in KERNEL_PINS if os.environ.get(k))
        raise IsaError(
            f"{given} pins only part of the CPU kernels; set all of "
            f"{', '.join(KERNEL_PINS)} (or none: fedtsp pins AVX2), or {CHOICE}=native"
        )


def tag() -> str:
    """The kernels of this process in a few words: what a checkpoint and a record store,
    and what a resume must match."""
    if state().pinned:
        return "avx2 (pinned)"
    if state().requested == "user":
        return "user " + ", ".join(f"{k}={os.environ.get(k)}" for k in KERNEL_PINS)
    from fedtsp.core.machine import cpu_class, vendor_of

    here = cpu_class()
    return f"native {here['capability']} ({vendor_of(here['model'])})"


def describe(device: str = "cpu") -> dict[str, Any]:
    """The record's ``environment.isa``: requested and effective levels, and the settings
    (on a CUDA ``device``, of the CPU side only)."""
    import torch

    current = state()
    names = [*KERNEL_PINS, *NUMPY_PINS]
    effective: dict[str, Any] = {"aten": str(torch.backends.cpu.get_cpu_capability())}
    effective |= _numpy_levels()
    out = {
        "requested": current.requested,
        "pinned": current.pinned,
        "tag": tag(),
        "settings": {k: os.environ.get(k) for k in names},
        "effective": effective,
    }
    if device != "cpu":
        out["note"] = f"{device} kernels are not pinned: only the CPU side's are"
    if current.loaded_before:
        out["unpinned_because"] = (
            f"{', '.join(current.loaded_before)} imported before fedtsp (their kernels may "
            "have been chosen before the pins were set)"
        )
    return out


def _numpy_levels() -> dict[str, Any]:
    """NumPy's highest enabled dispatch level and its OpenBLAS core."""
    out: dict[str, Any] = {}
    try:
        from numpy._core._multiarray_umath import __cpu_features__ as features
    except ImportError:  # an older NumPy: name the level as unknown rather than guess
        out["numpy"] = "unknown"
    else:
        out["numpy"] = next(
            (lvl for lvl in ("X86_V4", "X86_V3", "X86_V2") if features.get(lvl)), "baseline"
        )
    try:
        from threadpoolctl import threadpool_info

        cores = sorted(
            {
                str(i.get("architecture"))
                for i in threadpool_info()
                if i["internal_api"] == "openblas"
            }
        )
        out["openblas"] = ", ".join(cores) or None
    except ImportError:
        out["openblas"] = "unknown"
    return out


@cache  # fixed for the process's life; asked once per record
def versions() -> dict[str, str | None]:
    """The versions that decide a record's bits: torch (and its MKL and oneDNN), NumPy,
    SciPy, scikit-learn."""
    import torch

    out: dict[str, str | None] = {}
    for name in DISTRIBUTIONS:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    config = torch.__config__.show()
    out["mkl"] = _after(config, "Math Kernel Library Version ")
    out["onednn"] = _after(config, "MKL-DNN v")
    return out


def _after(text: str, marker: str) -> str | None:
    """The word after ``marker`` in ``text`` (a version in torch's build summary)."""
    _, found, rest = text.partition(marker)
    return rest.split()[0] if found and rest.split() else None


def record_environment(record_env: Mapping[str, Any]) -> tuple[dict[str, str | None], str]:
    """(the environment variables that rerun a record's kernels, where it can be checked).

    Pinned records: the pins, checkable on any AVX2 machine. Native records made at the AVX2
    level (before the pins existed, on AVX2 machines): the pins too, which reproduce them on
    AVX-512 machines (measured). Other native records: this machine's own kernels, which
    match only on the record's CPU class (vendor included).
    """
    isa = record_env.get("isa") or {}
    cpu = record_env.get("cpu") or {}
    native = level_variables("native")
    if isa.get("pinned") or (not isa and cpu.get("capability") == "AVX2"):
        return level_variables("avx2", isa.get("settings") or {}), AVX2_MACHINES
    if isa.get("requested") == "user":
        return {CHOICE: None, **isa.get("settings", {})}, "only where those settings run"
    if not cpu:
        return native, "only on the CPU class that made it (not recorded)"
    return native, f"only on {cpu_words(cpu)}"


def level_variables(
    level: str, numpy: Mapping[str, str | None] | None = None
) -> dict[str, str | None]:
    """The variables (None: unset) that start a process at ``level``: "avx2", the pins, with
    NumPy's settings from ``numpy`` where it has them (default: this environment), else
    ours; "native", none of the pins this process set."""
    if level == "native":
        return {CHOICE: "native", **dict.fromkeys(_native_changes())}
    given = os.environ if numpy is None else numpy
    numpy_pins = {k: given.get(k) or v for k, v in NUMPY_PINS.items()}
    return {CHOICE: "avx2", **KERNEL_PINS, **numpy_pins}


def _native_changes() -> list[str]:
    """The variables a switch to native kernels unsets: the kernel pins, and the NumPy pins
    this process added (not those the machine's environment set)."""
    return [*KERNEL_PINS, *sorted(_set_here)]


def cpu_words(cpu: Mapping[str, Any]) -> str:
    """A CPU class as a reader names it: vendor, kernel level and the flags that matter."""
    from fedtsp.core.machine import vendor_of

    flags = ", ".join(cpu.get("flags", []))
    return f"{vendor_of(cpu.get('model', ''))} {cpu.get('capability', '?')} ({flags})"


def inherited() -> dict[str, str]:
    """The variables that give a process started elsewhere (a Ray worker on another node)
    this process's kernels."""
    names = (CHOICE, *KERNEL_PINS, *NUMPY_PINS)
    return {k: os.environ[k] for k in names if os.environ.get(k)}


@contextmanager
def environment(changes: Mapping[str, str | None]) -> Iterator[None]:
    """``os.environ`` with ``changes`` (None: unset) while the block runs, for the child
    processes it starts; restored after."""
    before = {k: os.environ.get(k) for k in changes}
    try:
        _apply(changes)
        yield
    finally:
        _apply(before)


def _apply(changes: Mapping[str, str | None]) -> None:
    for name, value in changes.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value

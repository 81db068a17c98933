"""The CPU a run computed on, as far as it decides the numbers.

Unpinned, bit-identical histories hold on one CPU class only: PyTorch, oneDNN and MKL pick
their kernels by instruction set (AVX-512, AVX2, AMX, native bf16) and by vendor, and two
kernels sum in different orders (fedtsp.core.isa pins them to AVX2 by default). A record
names its class so that a rerun (`fedtsp verify`) can say which case it judged.
"""

from __future__ import annotations

import platform
from functools import lru_cache
from pathlib import Path
from typing import Any

# The instruction-set flags that change which kernels run (Linux /proc/cpuinfo names).
KERNEL_FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_tile")


@lru_cache(maxsize=1)
def cpu_class() -> dict[str, Any]:
    """{"model", "capability" (the best kernel level PyTorch would choose here unpinned),
    "flags" (those of KERNEL_FLAGS)}: the hardware; the kernels a run used are in its
    record's ``environment.isa``."""
    model, flags = platform.processor() or platform.machine(), set()
    info = Path("/proc/cpuinfo")
    if info.exists():
        for line in info.read_text(errors="replace").splitlines():
            name, _, value = line.partition(":")
            if name.strip() == "model name" and model in ("", platform.machine()):
                model = value.strip()
            elif name.strip() == "flags" and not flags:
                flags = set(value.split())
    return {
        "model": model,
        "capability": _native_level(flags),
        "flags": [f for f in KERNEL_FLAGS if f in flags],
    }


def _native_level(flags: set[str]) -> str:
    """PyTorch's own choice on a CPU with ``flags`` (its AVX512 level needs F, BW, VL, DQ)."""
    if {"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= flags:
        return "AVX512"
    return "AVX2" if {"avx2", "fma"} <= flags else "DEFAULT"


def vendor_of(model: str) -> str:
    """ "Intel", "AMD" or the model name itself: the same flags on two vendors' CPUs can
    still select different kernels (an Intel AVX-512 record differs on an AMD AVX-512 CPU)."""
    for vendor in ("Intel", "AMD"):
        if vendor.lower() in model.lower():
            return vendor
    return model or "unknown vendor"


def same_class(a: dict[str, Any] | None, b: dict[str, Any] | None) -> bool | None:
    """Whether two `cpu_class` values select the same kernels (same level, flags and
    vendor); None if either is unknown."""
    if not a or not b:
        return None
    return (
        a.get("capability") == b.get("capability")
        and a.get("flags") == b.get("flags")
        and vendor_of(a.get("model", "")) == vendor_of(b.get("model", ""))
    )

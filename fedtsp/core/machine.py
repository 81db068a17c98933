"""The CPU a run computed on, as far as it decides the numbers.

Bit-identical histories hold on one CPU class only: PyTorch and oneDNN pick their kernels
by instruction set (AVX-512, AVX2, AMX, native bf16), and two kernels sum in different
orders. A record names its class so that a rerun (`fedtsp verify`) can say which case it
judged.
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
    """{"model", "capability" (PyTorch's kernel level), "flags" (those of KERNEL_FLAGS)}."""
    import torch

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
        "capability": str(torch.backends.cpu.get_cpu_capability()),
        "flags": [f for f in KERNEL_FLAGS if f in flags],
    }


def same_class(a: dict[str, Any] | None, b: dict[str, Any] | None) -> bool | None:
    """Whether two `cpu_class` values select the same kernels; None if either is unknown."""
    if not a or not b:
        return None
    return a.get("capability") == b.get("capability") and a.get("flags") == b.get("flags")

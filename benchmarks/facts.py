"""What every committed benchmark output says about where and how it was measured."""

from __future__ import annotations

import json
import os
import platform
import sys
from pathlib import Path
from typing import Any

import torch

from fedtsp.core.machine import cpu_class
from fedtsp.core.paths import portable_path
from fedtsp.core.results import code_version
from fedtsp.engine.build import cpu_has_native_bf16


def cpu_model() -> str:
    """The CPU's model name (Linux: /proc/cpuinfo), else what platform reports."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_facts(device: str = "cpu") -> dict[str, Any]:
    facts: dict[str, Any] = {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "threads": torch.get_num_threads(),
        "cpu_capability": cpu_class()["capability"],  # the hardware's level
        "kernels": torch.backends.cpu.get_cpu_capability(),  # what PyTorch runs (pinned: AVX2)
        "native_bf16": cpu_has_native_bf16(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "device": device,
    }
    if device.startswith("cuda") and torch.cuda.is_available():
        facts["gpu"] = torch.cuda.get_device_name(device)
    return facts


def command_line() -> str:
    """This process's command, with paths inside the repository made relative."""
    words = [portable_path(w) if os.sep in w else w for w in sys.argv]
    return "python " + " ".join(words)


def _level(facts: dict[str, Any]) -> str:
    """The CPU's level, and the kernels' where they are pinned below it."""
    kernels = facts.get("kernels", facts["cpu_capability"])
    if kernels == facts["cpu_capability"]:
        return str(kernels)
    return f"{facts['cpu_capability']}, kernels pinned to {kernels}"


def write_result(
    path: Path, payload: dict[str, Any], markdown: str, code: dict[str, Any] | None = None
) -> None:
    """``path`` (JSON: the payload with command, code version and machine facts) and the
    markdown table beside it, headed by the same facts. ``code``: the code version taken
    when the measurement started (default: now), so that edits made while a long benchmark
    runs are not credited to it."""
    facts = payload.setdefault("machine", machine_facts())
    payload = {"command": command_line(), "code": code or code_version(), **payload}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=1) + "\n")
    code = payload["code"]
    commit = (code["git_commit"] or "unknown")[:7] + (" (uncommitted)" if code["git_dirty"] else "")
    head = (
        f"Measured at code {commit} on {facts['cpu']} ({facts['cores']} cores, "
        f"{facts['threads']} threads, {_level(facts)}), torch {facts['torch']}, "
        f"device {facts['device']}: `{payload['command']}`"
    )
    path.with_suffix(".md").write_text(head + "\n\n" + markdown.rstrip() + "\n")

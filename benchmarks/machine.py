"""The machine a benchmark ran on, named the same way by every script beside its ratio.

A ratio holds for the device it was measured on, so each script prints (and writes) this name: for a
CUDA device the GPU's own name; otherwise the CPU's model name from ``/proc/cpuinfo`` (the
processor's name where that file does not exist), the cores Python sees and the OS. torch is imported
only for a CUDA device, so scripts that never load it (the retrieval ones) stay light.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path


def cpu_name(cpuinfo: str | None = None) -> str:
    """The first processor's ``model name`` in ``cpuinfo`` (``/proc/cpuinfo`` when not given)."""
    if cpuinfo is None:
        path = Path("/proc/cpuinfo")
        cpuinfo = path.read_text() if path.is_file() else ""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name" and value.strip():
            return value.strip()
    return platform.processor() or platform.machine()


def machine_name(device: str = "cpu") -> str:
    """``device`` named for a reader: ``NVIDIA H200`` for ``cuda``/``cuda:N``, else ``CPU MODEL, N cores, OS``."""
    if device.startswith("cuda"):
        import torch

        return torch.cuda.get_device_name(device)
    return f"{cpu_name()}, {os.cpu_count()} cores, {platform.system()} {platform.machine()}"

"""What the machine is: cores, memory, CPU model, kernel, Python."""

from __future__ import annotations

import os
import platform
import sys
from pathlib import Path


def _first_value(path: str, key: str) -> str:
    try:
        for line in Path(path).read_text().splitlines():
            if line.startswith(key):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def machine_info() -> dict[str, str]:
    """nproc, total memory (GiB), CPU model, kernel and the harness's Python version."""
    mem_kib = _first_value("/proc/meminfo", "MemTotal").split()[0]
    memory = f"{int(mem_kib) / 1024 / 1024:.1f} GiB" if mem_kib.isdigit() else "unknown"
    return {
        "nproc": str(len(os.sched_getaffinity(0))),
        "memory": memory,
        "cpu": _first_value("/proc/cpuinfo", "model name"),
        "kernel": platform.release(),
        "python": sys.version.split()[0],
    }

"""The machine a benchmark ran on, as its results name it: the CPU's model name and the CPU count."""
from __future__ import annotations

import os
import platform


def cpu_name() -> str:
    """The CPU's model name from /proc/cpuinfo (e.g. "AMD EPYC 7B13"), else the architecture."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def describe() -> str:
    return f"{cpu_name()}, {os.cpu_count()} CPUs"

"""How many CPUs this process may use: the one count every pool of threads or processes sizes by."""

from __future__ import annotations

import os

__all__ = ["usable_cpus"]


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask, not the machine's count); at least 1."""
    if hasattr(os, "process_cpu_count"):  # Python 3.13+
        return int(os.process_cpu_count() or 1)
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0)) or 1
    return os.cpu_count() or 1

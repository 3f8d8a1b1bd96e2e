"""The cores a process of this host may compute on: its CPU set (a container's or taskset's), or
fewer under a container's CPU quota (cgroup v2 `cpu.max`: compose's `cpus`, Kubernetes' CPU
limit), which neither `os.cpu_count` nor torch's default thread count sees."""

from __future__ import annotations

import math
import os
from pathlib import Path

CPU_MAX = Path("/sys/fs/cgroup/cpu.max")


def host_cores(cpu_max: Path = CPU_MAX) -> int:
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    return within_quota(cores, cpu_max)


def within_quota(threads: int, cpu_max: Path = CPU_MAX) -> int:
    """`threads`, or fewer if a CPU quota allows fewer cores."""
    return min(threads, quota_cores(cpu_max) or threads)


def quota_cores(cpu_max: Path = CPU_MAX) -> int | None:
    """The cores a cgroup v2 CPU quota allows, rounded up ("200000 100000": 2); None without
    one ("max 100000", or no such file: cgroup v1, or not Linux)."""
    try:
        quota, period = cpu_max.read_text().split()[:2]
        return max(1, math.ceil(int(quota) / int(period)))
    except (OSError, ValueError, ZeroDivisionError):
        return None

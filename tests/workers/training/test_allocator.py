"""A trainer's freed large tensors leave its resident memory at once (glibc's heap would keep
them: its mmap threshold rises past a tensor's size after the first such tensor is freed)."""

from __future__ import annotations

import json
import platform
import subprocess
import sys

import pytest

PATTERN = """
import json, sys, psutil, torch
from workers.training.allocator import give_back_large_frees
if sys.argv[1] == "given":
    assert give_back_large_frees()
size = 8 * 2**20 // 4
torch.ones(size)  # made and freed: glibc's threshold now lies above this size
before = psutil.Process().memory_info().rss
kept = [torch.ones(size) for _ in range(40)]  # 320 MB, then all but the last freed
last = kept.pop()
kept.clear()
print(json.dumps({"held": psutil.Process().memory_info().rss - before}))
"""


def _held(mode: str) -> int:
    run = subprocess.run([sys.executable, "-c", PATTERN, mode], capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    return json.loads(run.stdout.strip().splitlines()[-1])["held"]


def test_freed_large_tensors_leave_resident_memory() -> None:
    if platform.libc_ver()[0] != "glibc":
        pytest.skip("not glibc: the allocator is not tuned")
    assert _held("default") > 250 * 2**20  # the heap kept 39 freed tensors resident
    assert _held("given") < 40 * 2**20  # one 8 MB tensor lives

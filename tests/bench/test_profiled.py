"""bench.profiled's tables: by self host time always, and by kernel time where the executor ran on
a GPU (here the same call on a host profile: torch takes the kernel sort key and lists the ops)."""

from __future__ import annotations

import torch
from torch.profiler import ProfilerActivity, profile

from bench.profiled import tables


def test_a_gpu_executors_tables_add_one_by_kernel_time() -> None:
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        torch.mm(torch.randn(64, 64), torch.randn(64, 64))
    host = tables(prof, on_gpu=False)
    both = tables(prof, on_gpu=True)
    assert host.startswith("== by self host time") and "aten::mm" in host
    assert "by kernel time" not in host
    first, kernels = both.split("== by kernel time (top 40)\n")
    assert first.strip() == host.strip() and "aten::mm" in kernels

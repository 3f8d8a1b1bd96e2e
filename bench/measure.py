"""Measuring: memory as PSS summed over process trees, and the machine's matmul peak."""

from __future__ import annotations

import contextlib
import threading
import time

import psutil
import torch


def tree_pss(pids: list[int]) -> int:
    """PSS (bytes) summed over these processes and all their descendants."""
    seen, total = set(), 0
    for pid in pids:
        try:
            root = psutil.Process(pid)
            procs = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            continue
        for proc in procs:
            if proc.pid in seen:
                continue
            seen.add(proc.pid)
            with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
                total += proc.memory_full_info().pss
    return total


class PeakPss:
    """Samples tree_pss in the background; `.peak` is the largest sum seen."""

    def __init__(self, pids_fn, every_s: float = 1.0) -> None:
        self.pids_fn = pids_fn
        self.every_s = every_s
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> PeakPss:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while True:  # first sample at once: a short window still gets one
            self.peak = max(self.peak, tree_pss(self.pids_fn()))
            if self._stop.wait(self.every_s):
                return


def matmul_peak_gflops(dtype: torch.dtype = torch.float32, size: int = 2048,
                       seconds: float = 3.0) -> float:
    """Best achieved GFLOP/s of one large matmul with the current thread count."""
    a, b = torch.randn(size, size, dtype=dtype), torch.randn(size, size, dtype=dtype)
    a @ b
    best, deadline = 0.0, time.monotonic() + seconds
    while time.monotonic() < deadline:
        started = time.perf_counter()
        a @ b
        best = max(best, 2 * size**3 / (time.perf_counter() - started) / 1e9)
    return best

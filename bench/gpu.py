"""What a GPU run measures beside tokens/s: the GPU's memory and how busy it is (sampled from
`nvidia-smi` while a group runs, so every process on the device counts, the executor's and the
MPS server's included), and NVIDIA MPS for the whole run, both sides alike.

On a machine without `nvidia-smi` nothing here samples: `GpuSampler.available()` is False and
the scenarios fall back to host memory (PSS), so the harness can still be checked on a CPU.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path

QUERY = "memory.used,memory.total,utilization.gpu"


@dataclass
class GpuSample:
    used_mb: float
    total_mb: float
    busy_percent: float


def parse_sample(line: str) -> GpuSample | None:
    """One line of `nvidia-smi --query-gpu=memory.used,memory.total,utilization.gpu
    --format=csv,noheader,nounits` (None for a line that is not one, e.g. "[N/A]")."""
    try:
        used, total, busy = (float(part) for part in line.split(","))
    except ValueError:
        return None
    return GpuSample(used, total, busy)


@dataclass
class GpuReading:
    """What a sampler saw over one window."""

    samples: list[GpuSample] = field(default_factory=list)

    @property
    def peak_used_mb(self) -> float | None:
        return max((s.used_mb for s in self.samples), default=None)

    @property
    def total_mb(self) -> float | None:
        return self.samples[-1].total_mb if self.samples else None

    @property
    def mean_busy_percent(self) -> float | None:
        if not self.samples:
            return None
        return sum(s.busy_percent for s in self.samples) / len(self.samples)


class GpuSampler:
    """`nvidia-smi` streaming one line per period for GPU `index` while the context is open."""

    def __init__(self, index: int = 0, period_ms: int = 200) -> None:
        self.index = index
        self.period_ms = period_ms
        self.reading = GpuReading()
        self._proc: subprocess.Popen | None = None
        self._thread: threading.Thread | None = None

    @staticmethod
    def available() -> bool:
        return shutil.which("nvidia-smi") is not None

    def __enter__(self) -> GpuSampler:
        self._proc = subprocess.Popen(
            ["nvidia-smi", f"--query-gpu={QUERY}", "--format=csv,noheader,nounits",
             "-i", str(self.index), f"--loop-ms={self.period_ms}"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        assert self._proc is not None and self._thread is not None
        self._proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._proc.wait(5)
        self._thread.join(5)

    def _read(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        for line in self._proc.stdout:
            if (sample := parse_sample(line)) is not None:
                self.reading.samples.append(sample)


def idle_used_mb(index: int = 0) -> float | None:
    """The GPU memory in use now (before a side starts: what is not that side's)."""
    if not GpuSampler.available():
        return None
    out = subprocess.run(["nvidia-smi", f"--query-gpu={QUERY}", "--format=csv,noheader,nounits",
                          "-i", str(index)], capture_output=True, text=True, timeout=30)
    sample = parse_sample(out.stdout.strip())
    return sample.used_mb if sample else None


@contextlib.contextmanager
def mps(enabled: bool):
    """NVIDIA MPS for the whole run, both sides alike (`launcher.mps`: a daemon that already
    serves is used as it is, else one is started and stopped at the end). Processes on one GPU
    otherwise pay a context switch (~350 us) at every hand-over."""
    if not enabled:
        yield False
        return
    from launcher.mps import MpsDaemon, serving

    if serving(os.environ):
        yield True
        return
    on_gpu = {**os.environ, "SYMBIOSIS_EXECUTOR_DEVICE": "cuda", "SYMBIOSIS_WORKER_DEVICE": "cuda",
              "SYMBIOSIS_MPS": "auto"}
    directory = Path(tempfile.mkdtemp(prefix="symb-bench-mps-"))  # its log: gone with it
    try:
        daemon, why = MpsDaemon.plan(on_gpu, directory)
        if daemon is None:
            raise RuntimeError(f"--mps: {why}")
        daemon.start(os.environ)
        os.environ.update(daemon.env())  # every process started from here on finds it
        try:
            yield True
        finally:
            daemon.stop(os.environ)
    finally:
        shutil.rmtree(directory, ignore_errors=True)

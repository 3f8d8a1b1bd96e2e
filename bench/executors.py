"""Executor processes for benchmarks: started on first use, kept for the run, then stopped."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path

PROFILED_STOP_S = 300  # a profiled executor sums its events on stopping


class ExecutorProcess:
    """`python -m executor`; with `profile`, under torch.profiler (`bench.profiled`), which
    writes its top operators there on stopping."""

    def __init__(self, model: str, policy: str, threads: int | None, dtype: str,
                 device: str = "cpu", extra: tuple[str, ...] = (),
                 profile: Path | None = None, twin: bool = False) -> None:
        self.directory = Path(tempfile.mkdtemp(prefix="symb-bench-"))  # removed on stopping
        self.endpoint = f"ipc://{self.directory / 'executor.sock'}"
        # where the jobs call: the idle twin's endpoint (`executor.twin`), if it has one
        self.training_endpoint = f"ipc://{self.directory / 'twin.sock'}" if twin \
            else self.endpoint
        self.profile = profile
        args = ["--model", model, "--bind", self.endpoint, "--policy", policy, "--dtype", dtype,
                "--device", device]
        if threads:
            args += ["--threads", str(threads)]
        if twin:
            args += ["--idle-twin", self.training_endpoint]
        args += list(extra)
        launcher = ["bench.profiled", "--out", str(profile), "--"] if profile else ["executor"]
        args = [sys.executable, "-m", *launcher, *args]
        self.proc = subprocess.Popen(args, stderr=subprocess.PIPE, text=True,
                                     env={**os.environ, "OMP_WAIT_POLICY": "PASSIVE"})
        ready, log = threading.Event(), []
        self.log = log

        waiting = {self.endpoint, self.training_endpoint}  # its twin's too, if it has one

        def pump() -> None:
            for line in self.proc.stderr:
                log.append(line)
                if "executor ready" in line:
                    waiting.difference_update(e for e in list(waiting) if f"bind={e}" in line)
                    if not waiting:
                        ready.set()

        threading.Thread(target=pump, daemon=True).start()
        deadline = time.monotonic() + 900
        while not ready.wait(0.2):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.proc.kill()
                raise RuntimeError("executor failed to start:\n" + "".join(log[-30:]))

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def pids(self) -> list[int]:
        """Its process and its twin's, if any (for memory)."""
        import psutil

        with contextlib.suppress(psutil.NoSuchProcess):
            return [self.pid, *(p.pid for p in psutil.Process(self.pid).children())]
        return [self.pid]

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(PROFILED_STOP_S if self.profile else 20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        shutil.rmtree(self.directory, ignore_errors=True)


class ExecutorPool:
    """One executor per (model, policy, threads, dtype, device), shared by a benchmark run's
    scenarios (their clients come and go; the executor keeps nothing between calls)."""

    def __init__(self) -> None:
        self._running: dict[tuple, ExecutorProcess] = {}

    def get(self, model: str, *, policy: str = "opportunistic", threads: int | None = None,
            dtype: str = "float32", device: str = "cpu", twin: bool = False) -> ExecutorProcess:
        """With `twin`, an executor with its idle twin for the jobs (`executor.twin`), another
        process than the one of the same settings without."""
        key = (model, policy, threads, dtype, device, twin)
        if key not in self._running or self._running[key].proc.poll() is not None:
            self._running[key] = ExecutorProcess(model, policy, threads, dtype, device,
                                                 twin=twin)
        return self._running[key]

    def close(self) -> None:
        for process in self._running.values():
            process.stop()
        self._running.clear()


@contextmanager
def executor(model: str, *, policy: str = "opportunistic", threads: int | None = None,
             dtype: str = "float32", device: str = "cpu", profile: Path | None = None):
    """A private executor for one measurement: yields (endpoint, pid). With `profile`, it runs
    under torch.profiler and writes its top operators there when stopped."""
    process = ExecutorProcess(model, policy, threads, dtype, device, profile=profile)
    try:
        yield process.endpoint, process.pid
    finally:
        process.stop()

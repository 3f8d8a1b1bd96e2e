"""Start and stop executor processes for benchmarks."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def executor(model: str, *, policy: str = "opportunistic", threads: int | None = None,
             dtype: str = "float32", extra: tuple[str, ...] = ()):
    """Yields (endpoint, pid) of a running executor; stops it afterwards."""
    path = Path(tempfile.mkdtemp(prefix="symb-bench-")) / "executor.sock"
    args = [sys.executable, "-m", "executor", "--model", model, "--bind", f"ipc://{path}",
            "--policy", policy, "--dtype", dtype, *extra]
    if threads:
        args += ["--threads", str(threads)]
    proc = subprocess.Popen(args, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "OMP_WAIT_POLICY": "PASSIVE"})
    ready = threading.Event()
    log: list[str] = []

    def pump() -> None:
        for line in proc.stderr:
            log.append(line)
            if "executor ready" in line:
                ready.set()

    threading.Thread(target=pump, daemon=True).start()
    deadline = time.monotonic() + 600
    while not ready.wait(0.2):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError("executor failed to start:\n" + "".join(log[-30:]))
    try:
        yield f"ipc://{path}", proc.pid
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()

"""Test helpers: real executor processes and plain transformers + peft references."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from wire.probes import executor_answers

READY_TIMEOUT_S = 120


def short_tmp() -> Path:
    """A short directory for ipc:// socket paths (they are limited to ~100 bytes); its caller
    removes it (a test takes the `short_dir` fixture, which does)."""
    return Path(tempfile.mkdtemp(prefix="symb-", dir="/tmp"))


def priorities(pid: int) -> set[tuple[int, int]]:
    """(scheduling policy, nice) of each thread of the process (Linux)."""
    return {(os.sched_getscheduler(int(tid)), os.getpriority(os.PRIO_PROCESS, int(tid)))
            for tid in os.listdir(f"/proc/{pid}/task")}


def calls_by_kind(endpoint: str) -> tuple[int, int]:
    """(inference, training) calls the executor at `endpoint` has run so far (its stats)."""
    from workers.remote.client import ExecutorClient

    probe = ExecutorClient(endpoint, name="probe")
    try:
        kinds = probe.stats().kinds
    finally:
        probe.close()
    return kinds["inference"].calls, kinds["training"].calls


@dataclass
class ExecutorProcess:
    endpoint: str
    proc: subprocess.Popen
    log: list[str] = field(default_factory=list)

    @classmethod
    def start(cls, model: str, socket_path: Path, **options: str) -> ExecutorProcess:
        endpoint = f"ipc://{socket_path}"
        args = [sys.executable, "-m", "executor", "--model", model, "--bind", endpoint]
        for key, value in options.items():  # a value "" is a bare flag
            args += [f"--{key.replace('_', '-')}", *([str(value)] if value != "" else [])]
        proc = subprocess.Popen(args, stderr=subprocess.PIPE, text=True,
                                env={**os.environ, "OMP_WAIT_POLICY": "PASSIVE"})
        started = cls(endpoint, proc)

        def pump() -> None:
            for line in proc.stderr:
                started.log.append(line)

        threading.Thread(target=pump, daemon=True).start()
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not executor_answers(endpoint, 500):
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError("executor did not start:\n" + "".join(started.log))
            time.sleep(0.05)
        return started

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 10) -> int:
        """The exit status once it exits; where it outlives `timeout`, an error with its last
        log lines and its threads' stacks (`wire.stopping`), the process killed."""
        if self.alive():
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.send_signal(signal.SIGUSR1)  # its threads' stacks into the log
            time.sleep(1)
            self.proc.kill()
            raise RuntimeError(f"executor still running {timeout:.1f} s after signal {sig}:\n"
                               + "".join(self.log[-60:])) from None

"""The harness's side of `bench.forked`: start the preloaded parent once, launch groups of
clients from it, learn when they are done."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import subprocess
import sys
import threading

import psutil


class Zygote:
    def __init__(self, env: dict[str, str]) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "bench.forked"], env=env, text=True,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self._messages: queue.Queue[dict | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def launch(self, argvs: list[list[str]], timeout_s: float = 300) -> ForkedClients:
        self.proc.stdin.write(json.dumps({"argvs": argvs}) + "\n")
        self.proc.stdin.flush()
        message = self.receive(timeout_s)
        if message is None:
            raise TimeoutError("the preloaded benchmark parent did not fork the clients")
        return ForkedClients(self, message["pids"])

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.proc.stdin.close()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()

    def receive(self, timeout_s: float) -> dict | None:
        """Its next message, or None if none came in time (0: do not wait)."""
        try:
            message = self._messages.get(timeout=timeout_s) if timeout_s > 0 else \
                self._messages.get_nowait()
        except queue.Empty:
            return None
        if message is None:
            raise RuntimeError(f"the preloaded benchmark parent exited ({self.proc.poll()})")
        return message

    def _read(self) -> None:
        for line in self.proc.stdout:
            self._messages.put(json.loads(line))
        self._messages.put(None)


class ForkedClients:
    """One launched group: pids, and whether they have exited (and how)."""

    def __init__(self, zygote: Zygote, pids: list[int]) -> None:
        self.zygote, self.pids = zygote, pids
        self.failed: int | None = None

    def done(self) -> bool:
        if self.failed is None and (message := self.zygote.receive(0)) is not None:
            self.failed = message["failed"]
        return self.failed is not None

    def any_exited(self) -> bool:
        """Whether some client has exited (its parent may not have reaped it yet)."""
        for pid in self.pids:
            try:
                if psutil.Process(pid).status() in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD):
                    return True
            except psutil.NoSuchProcess:
                return True
        return False

    def kill(self) -> None:
        if self.failed is not None:
            return
        for pid in self.pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        message = self.zygote.receive(60)  # all reaped: the parent takes the next group
        self.failed = len(self.pids) if message is None else message["failed"]

"""The manager's side of the spawner: start it, ask for workers and trainers, read its events."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys

import msgspec

from wire import spawner as S


class SpawnerProcess:
    def __init__(self, proc: subprocess.Popen) -> None:
        self.proc = proc
        self.stdout = proc.stdout
        self._buffer = b""
        os.set_blocking(self.stdout.fileno(), False)

    @classmethod
    def start(cls, model: str) -> SpawnerProcess:
        proc = subprocess.Popen([sys.executable, "-m", "workers.spawner", "--model", model],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                env={**os.environ, "OMP_WAIT_POLICY": "PASSIVE"})
        line = proc.stdout.readline()  # blocks until the imports and the tokenizer are loaded
        try:
            ready = S.decode_event(line) if line else None
        except (msgspec.DecodeError, msgspec.ValidationError):
            ready = None
        if not isinstance(ready, S.SpawnerReady):
            raise RuntimeError(f"the worker spawner failed to start (exit {proc.poll()})")
        return cls(proc)

    def spawn(self, spec: S.WorkerSpec | S.TrainerSpec) -> None:
        self.proc.stdin.write(S.encode(spec))
        self.proc.stdin.flush()

    def read(self) -> list[S.Spawned | S.Exited]:
        try:
            chunk = os.read(self.stdout.fileno(), 65536)
        except BlockingIOError:
            return []
        if not chunk:
            return []
        self._buffer += chunk
        events = []
        while b"\n" in self._buffer:
            line, self._buffer = self._buffer.split(b"\n", 1)
            if line.strip():
                events.append(S.decode_event(line))
        return events

    @staticmethod
    def kill(pid: int) -> None:
        """A worker or trainer it forked, at once (one that did not stop when told)."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()  # the spawner stops its workers when its stdin closes
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()

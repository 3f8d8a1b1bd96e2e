"""The manager's side of the spawner: start it, ask for workers, read its JSON-line events."""

from __future__ import annotations

import json
import os
import subprocess
import sys


class SpawnerProcess:
    def __init__(self, proc: subprocess.Popen) -> None:
        self.proc = proc
        self.stdout = proc.stdout
        self._buffer = b""
        os.set_blocking(self.stdout.fileno(), False)

    @classmethod
    def start(cls, model: str, timeout_s: float = 300) -> SpawnerProcess:
        proc = subprocess.Popen([sys.executable, "-m", "workers.spawner", "--model", model],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                env={**os.environ, "OMP_WAIT_POLICY": "PASSIVE"})
        line = proc.stdout.readline()  # blocks until the imports and the tokenizer are loaded
        if not line or "ready" not in json.loads(line):
            raise RuntimeError(f"the worker spawner failed to start (exit {proc.poll()})")
        return cls(proc)

    def spawn(self, config: dict) -> None:
        self._send({"spawn": config})

    def train(self, config: dict) -> None:
        self._send({"train": config})

    def _send(self, request: dict) -> None:
        self.proc.stdin.write((json.dumps(request) + "\n").encode())
        self.proc.stdin.flush()

    def read(self) -> list[dict]:
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
                events.append(json.loads(line))
        return events

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()  # the spawner stops its workers when its stdin closes
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()

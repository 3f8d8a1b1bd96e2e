"""One trainer per job at a time.

A trainer holds its job's lock (an flock on DATA_DIR/jobs/<job>/trainer.lock) while it runs; the
kernel lets go of it when the process ends, however it ends. A trainer started while an earlier
one of the same job is still stopping (the worker manager killed and started again: the old
spawner's trainers take up to 8 s to save a checkpoint and exit) waits for it, instead of
reading the checkpoint the other is about to write and writing beside it.
"""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Callable
from pathlib import Path

POLL_S = 0.2


class JobLock:
    def __init__(self, data_dir: Path, job_id: str) -> None:
        self.path = data_dir / "jobs" / job_id / "trainer.lock"
        self._fd: int | None = None

    def take(self, waiting: Callable[[], None], stopping: Callable[[], bool]) -> bool:
        """True once held; False if `stopping()` says so first. `waiting` is called once, when
        another trainer of the job holds it."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        told = False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                if stopping():
                    os.close(fd)
                    return False
                if not told:
                    waiting()
                    told = True
                time.sleep(POLL_S)
                continue
            self._fd = fd
            return True

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # the lock goes with it
            self._fd = None

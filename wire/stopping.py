"""A process's main thread waiting to stop: on SIGTERM or SIGINT, or when told to (the
executor's, the worker manager's and the launcher's).

CPython runs signal handlers on the main thread only, and a main thread asleep in a lock
(`threading.Event.wait()`) wakes only for a signal the kernel delivered to it; one delivered to
any other thread (the serving threads, torch's, ZeroMQ's) sets a flag nobody looks at, and the
process sleeps through it (an executor in CI outlived its SIGTERM by a minute). Here the main
thread sleeps in select() on a pipe that CPython's own C-level handler writes to
(`signal.set_wakeup_fd`), whichever thread the signal reached; the Python handler then runs on
the main thread as soon as it wakes, and only sets a flag (a handler that set an Event could
deadlock on the Event's own lock, held by the main thread it interrupted in `Event.wait`). A
stuck process tells where its threads are on SIGUSR1 (`faulthandler`, written from the C
handler: it needs neither the main thread nor the GIL).
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import select
import signal
import time

RECHECK_S = 1.0  # a signal noticed by the handler but not by select() waits at most this long


class StopSignal:
    """`wait()` (main thread only) returns once SIGTERM or SIGINT came or `set()` was called
    (from any thread), or after `timeout` seconds where one is given."""

    def __init__(self, signals: tuple[int, ...] = (signal.SIGTERM, signal.SIGINT)) -> None:
        self._read, self._write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._stopped = False
        self.signal: int | None = None
        signal.set_wakeup_fd(self._write, warn_on_full_buffer=False)
        for sig in signals:
            signal.signal(sig, self._on_signal)
        faulthandler.register(signal.SIGUSR1, all_threads=True)

    def _on_signal(self, signum: int, _frame) -> None:
        self.signal = signum
        self._stopped = True

    def set(self) -> None:
        self._stopped = True
        with contextlib.suppress(BlockingIOError):
            os.write(self._write, b"\0")

    def is_set(self) -> bool:
        return self._stopped

    def wait(self, timeout: float | None = None) -> bool:
        """Whether it stopped (False: `timeout` passed first)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._stopped:
            left = RECHECK_S if deadline is None else min(RECHECK_S, deadline - time.monotonic())
            if left <= 0:
                break
            select.select([self._read], [], [], left)
            with contextlib.suppress(BlockingIOError):
                os.read(self._read, 512)
        return self._stopped

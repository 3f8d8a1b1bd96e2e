"""Adapter uploads read off the manager's loop: an upload's check and the digest of its tensors
(which reads every byte: ~1 s for a few hundred MB) run on a thread of their own, one upload at
a time in the order they came, while the loop serves every tenant on; a pipe wakes the loop when
one is done, and the loop writes its record (the records keep one writing thread)."""

from __future__ import annotations

import contextlib
import os
import queue
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial
from pathlib import Path

from wire.store import StoreCommand
from workers.manager.adapter_store import Inspected

Outcome = Inspected | Exception  # what was found, or why the upload is refused


class Inspector:
    def __init__(self, inspect: Callable[[Path], Inspected]) -> None:
        self._inspect = inspect
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="adapter-inspector")
        self._done: queue.SimpleQueue[tuple[bytes, StoreCommand, Future]] = queue.SimpleQueue()
        self._wake_r, self._wake_w = os.pipe()
        for fd in (self._wake_r, self._wake_w):
            os.set_blocking(fd, False)

    def fileno(self) -> int:
        """Readable when an upload is done (for the loop's poller)."""
        return self._wake_r

    def submit(self, to: bytes, command: StoreCommand, staged: Path) -> None:
        future = self._pool.submit(self._inspect, staged)
        future.add_done_callback(partial(self._finished, to, command))

    def ready(self) -> Iterator[tuple[bytes, StoreCommand, Outcome]]:
        """The uploads done since last asked: who asked, the command, and its outcome."""
        with contextlib.suppress(BlockingIOError):
            os.read(self._wake_r, 4096)
        while True:
            try:
                to, command, future = self._done.get_nowait()
            except queue.Empty:
                return
            failed = future.exception()
            yield to, command, failed if isinstance(failed, Exception) else future.result()

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
        os.close(self._wake_r)
        os.close(self._wake_w)

    def _finished(self, to: bytes, command: StoreCommand, future: Future) -> None:
        self._done.put((to, command, future))  # first, so that a wake-up always finds it
        with contextlib.suppress(OSError):  # a full pipe wakes the loop already
            os.write(self._wake_w, b"!")

"""Per-layer queues of pending calls and the choice of what runs next.

Bookkeeping only: no tensors are touched here. `add` is called by the IO thread, `next_batch` by
the compute loop; both under the scheduler's condition variable.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable

from executor.calls import PendingCall
from executor.protocol import Op


class Scheduler:
    def __init__(self, *, max_batch_rows: int = 8192,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.max_batch_rows = max_batch_rows
        self.clock = clock
        self.queues: dict[tuple[int, Op], deque[PendingCall]] = {}
        self.cond = threading.Condition()
        self._seq = 0

    def add(self, call: PendingCall) -> None:
        with self.cond:
            self._seq += 1
            call.seq = self._seq
            self.queues.setdefault(call.key, deque()).append(call)
            self.cond.notify()

    def depth(self) -> int:
        return sum(len(q) for q in self.queues.values())

    def next_batch(self) -> list[PendingCall] | float | None:
        """A batch to run now, else seconds until one may be ready (None: nothing queued)."""
        ready = [q for q in self.queues.values() if q]
        if not ready:
            return None
        queue = min(ready, key=lambda q: q[0].seq)
        return self._take(queue)

    def wait_batch(self, stop: threading.Event, idle_s: float = 0.1) -> list[PendingCall] | None:
        """Block until a batch is ready or `stop` is set."""
        with self.cond:
            while not stop.is_set():
                result = self.next_batch()
                if isinstance(result, list):
                    return result
                self.cond.wait(idle_s if result is None else min(result, idle_s))
        return None

    def _take(self, queue: deque[PendingCall]) -> list[PendingCall]:
        batch = [queue.popleft()]
        rows = batch[0].rows
        while queue and rows + queue[0].rows <= self.max_batch_rows:
            call = queue.popleft()
            rows += call.rows
            batch.append(call)
        return batch

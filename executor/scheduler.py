"""Per-layer queues of pending calls and the choice of what runs next.

Bookkeeping only: no tensors are touched here. Thread-safe: calls are added by whichever executor
thread drains the socket, and batches are taken by whichever holds the compute slot.
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
        self.lock = threading.Lock()
        self._seq = 0

    def add(self, call: PendingCall) -> None:
        with self.lock:
            self._seq += 1
            call.seq = self._seq
            self.queues.setdefault(call.key, deque()).append(call)

    def depth(self) -> int:
        with self.lock:
            return sum(len(q) for q in self.queues.values())

    def next_batch(self) -> list[PendingCall] | None:
        """Pop the batch to run now, if any."""
        with self.lock:
            ready = [q for q in self.queues.values() if q]
            if not ready:
                return None
            return self._take(min(ready, key=lambda q: q[0].seq))

    def ready_in(self) -> float | None:
        """Seconds until a batch may be ready (0: now); None when nothing is queued."""
        with self.lock:
            return 0.0 if any(self.queues.values()) else None

    def _take(self, queue: deque[PendingCall]) -> list[PendingCall]:
        batch = [queue.popleft()]
        rows = batch[0].rows
        while queue and rows + queue[0].rows <= self.max_batch_rows:
            call = queue.popleft()
            rows += call.rows
            batch.append(call)
        return batch

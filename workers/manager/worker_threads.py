"""Inference workers' torch threads: an operator's fixed count, else the cores shared out among
the live workers (starting or ready). A worker is spawned with its share; as workers start and
stop, the ready ones are told their new share (`W.WorkerThreads`). A worker runs each forward on
as many of its share's threads as the forward's tokens keep busy (`workers.threads`): decode on
one, a long prompt's prefill on up to all. Trainers are not counted: they run at a lower
priority (nice, SCHED_BATCH) and take only what inference leaves."""

from __future__ import annotations

import logging
from collections.abc import Callable

from wire import manager as W
from workers.manager.capacity import ThreadShare
from workers.manager.pool import WorkerHandle, WorkerPool

log = logging.getLogger("workers.manager")


class WorkerThreads:
    def __init__(self, pool: WorkerPool, share: ThreadShare,
                 send: Callable[[str, W.Message], None]) -> None:
        self.pool = pool
        self.share = share
        self.send = send
        self.last = 0  # the share last logged

    def live(self) -> int:
        """Workers starting or ready (one about to be spawned is in the pool already)."""
        return sum(h.state != "stopping" for h in self.pool.workers.values())

    def spawning(self, handle: WorkerHandle) -> None:
        """The threads a worker is spawned with (`WorkerSpec.threads`): its share now."""
        handle.threads = self.share.of(self.live())

    def tell(self) -> None:
        """Tell each ready worker its share where it has changed since it last heard."""
        live = self.live()
        share = self.share.of(live)
        if share != self.last and live:
            log.info("%d worker(s) live: each on %d threads at most", live, share)
            self.last = share
        for handle in self.pool.workers.values():
            if handle.state == "ready" and handle.threads != share:
                self.send(handle.key, W.WorkerThreads(share))
                handle.threads = share

"""Which inference workers exist, and which one to stop when room is needed. Bookkeeping only.

A worker serves one (tenant, model) pair. At most `max_workers` live at once; room is made by
stopping the least recently used idle worker that is not pinned. Workers idle longer than
`idle_s` are stopped too. Pinned (tenant, model) pairs are never evicted.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from wire import manager as W


def worker_key(tenant: str, model: str) -> str:
    return f"{tenant}|{model}"


@dataclass
class WorkerHandle:
    key: str
    tenant: str
    model: str
    started: float
    pid: int = 0
    state: str = "starting"  # starting | ready | stopping
    last_used: float = 0.0
    fallback: bool = False
    inflight: set[str] = field(default_factory=set)  # request ids
    pending: list[W.Generate] = field(default_factory=list)  # waiting for Ready


class NoCapacity(Exception):
    pass


class WorkerPool:
    def __init__(self, *, max_workers: int = 8, idle_s: float = 600.0,
                 pinned: set[str] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.max_workers = max_workers
        self.idle_s = idle_s
        self.pinned = pinned or set()
        self.clock = clock
        self.workers: dict[str, WorkerHandle] = {}
        self.counters = {"worker_starts": 0, "worker_evictions": 0, "worker_crashes": 0,
                         "fallbacks": 0}

    def get(self, tenant: str, model: str) -> WorkerHandle | None:
        handle = self.workers.get(worker_key(tenant, model))
        if handle is not None and handle.state != "stopping":
            handle.last_used = self.clock()
            return handle
        return None

    def add(self, tenant: str, model: str) -> tuple[WorkerHandle, list[WorkerHandle]]:
        """A new handle, and the workers to stop to make room for it (raises NoCapacity)."""
        evict: list[WorkerHandle] = []
        live = [h for h in self.workers.values() if h.state != "stopping"]
        while len(live) - len(evict) >= self.max_workers:
            victim = self._lru_victim(exclude=evict)
            if victim is None:
                raise NoCapacity(f"all {self.max_workers} workers are busy or pinned")
            evict.append(victim)
        for victim in evict:
            victim.state = "stopping"
            self.counters["worker_evictions"] += 1
        now = self.clock()
        handle = WorkerHandle(worker_key(tenant, model), tenant, model, started=now,
                              last_used=now)
        self.workers[handle.key] = handle
        self.counters["worker_starts"] += 1
        return handle, evict

    def idle(self) -> list[WorkerHandle]:
        """Workers idle past the timeout (marked stopping)."""
        now = self.clock()
        stale = [h for h in self.workers.values()
                 if h.state == "ready" and not h.inflight and h.key not in self.pinned
                 and now - h.last_used > self.idle_s]
        for handle in stale:
            handle.state = "stopping"
            self.counters["worker_evictions"] += 1
        return stale

    def remove(self, key: str) -> WorkerHandle | None:
        return self.workers.pop(key, None)

    def by_pid(self, pid: int) -> WorkerHandle | None:
        return next((h for h in self.workers.values() if h.pid == pid), None)

    def _lru_victim(self, exclude: list[WorkerHandle]) -> WorkerHandle | None:
        candidates = [h for h in self.workers.values()
                      if h.state == "ready" and not h.inflight and h.key not in self.pinned
                      and h not in exclude]
        return min(candidates, key=lambda h: h.last_used, default=None)

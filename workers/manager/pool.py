"""Which inference workers exist, and which one to stop when room is needed. Bookkeeping only.

A worker serves one tenant: its base model and any of its adapters. Tenants the operator lets
share (`shared_tenants`) are served instead by a pool of `shared_workers` workers, each tenant by
one of them (by a stable hash of its id: its adapters stay together), several tenants' adapters
in one batch: for platforms of thousands of small tenants, at the price of the isolation (a
crash in a shared worker fails its requests of every tenant there). At most `max_workers` live
at once; room is made by stopping the least recently used idle worker that is not pinned. Workers
idle longer than `idle_s` are stopped too. A tenant with a pinned model is never evicted.

Against thrashing under a burst across more adapters than slots: a worker is not evicted before
it has lived `min_residency_s`, and at most `max_evictions_per_min` evictions happen a minute.
When those rules, or busy or starting workers, stand in the way, `add` raises `NotYet`: the
request waits for room instead of failing (the broker retries it), and the cache keeps the
workers it just started. Only slots all pinned are `NoCapacity` at once.
"""

from __future__ import annotations

import time
import zlib
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from wire import manager as W

SHARED = "~shared-"  # a shared worker's key: no tenant id has a "~"


def model_key(tenant: str, model: str) -> str:
    """A tenant's model (an adapter version, or the base): what a circuit breaker guards."""
    return f"{tenant}|{model}"


@dataclass
class WorkerHandle:
    key: str
    tenant: str  # a shared worker's: its key
    started: float
    pid: int = 0
    state: str = "starting"  # starting | ready | stopping
    last_used: float = 0.0
    models: set[str] = field(default_factory=set)  # served and not let go since
    inflight: dict[str, str] = field(default_factory=dict)  # request id -> its model_key
    pending: dict[str, W.Generate] = field(default_factory=dict)  # by id: waiting for Ready
    adapters: W.AdapterCache | None = None  # what it last said it holds
    threads: int = 1  # its share of the cores as it last heard it (`worker_threads`)


class NoCapacity(Exception):
    pass


class NotYet(NoCapacity):
    """Room will be made shortly (a worker comes of age, or the eviction rate falls): wait."""


class WorkerPool:
    def __init__(self, *, max_workers: int = 8, idle_s: float = 600.0,
                 pinned: set[str] | None = None, min_residency_s: float = 0.0,
                 max_evictions_per_min: int = 0, shared_workers: int = 0,
                 shared_tenants: frozenset[str] = frozenset(),
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.max_workers = max_workers
        self.idle_s = idle_s
        self.pinned = pinned or set()
        self.min_residency_s = min_residency_s
        self.max_evictions_per_min = max_evictions_per_min  # 0: no cap
        self.shared_workers = shared_workers
        self.shared_tenants = shared_tenants  # "*": every tenant
        self.clock = clock
        self._evicted_at: deque[float] = deque()
        self.workers: dict[str, WorkerHandle] = {}
        self.counters = {"worker_starts": 0, "worker_evictions": 0, "worker_crashes": 0,
                         "fallbacks": 0}

    def key_of(self, tenant: str) -> str:
        """The key of the worker that serves `tenant`: its own, or a shared one."""
        if self.shared_workers and (tenant in self.shared_tenants or "*" in self.shared_tenants):
            return f"{SHARED}{zlib.crc32(tenant.encode()) % self.shared_workers}"
        return tenant

    def of_tenant(self, tenant: str) -> WorkerHandle | None:
        """The worker that serves the tenant, if one lives."""
        return self.workers.get(self.key_of(tenant))

    def is_pinned(self, key: str) -> bool:
        """Pinning `tenant|model` (or `tenant`) pins the tenant's worker."""
        return any(self.key_of(pin.partition("|")[0]) == key for pin in self.pinned)

    def get(self, tenant: str) -> WorkerHandle | None:
        handle = self.workers.get(self.key_of(tenant))
        if handle is not None and handle.state != "stopping":
            handle.last_used = self.clock()
            return handle
        return None

    def add(self, tenant: str) -> tuple[WorkerHandle, list[WorkerHandle]]:
        """A new handle, and the workers to stop to make room for it (raises NoCapacity)."""
        evict: list[WorkerHandle] = []
        live = [h for h in self.workers.values() if h.state != "stopping"]
        now = self.clock()
        while len(live) - len(evict) >= self.max_workers:
            victim = self._lru_victim(exclude=evict, now=now)
            if victim is None:
                if all(self.is_pinned(h.key) for h in live):
                    raise NoCapacity(f"all {self.max_workers} workers are pinned")
                raise NotYet(f"the {self.max_workers} workers are busy, starting, or younger "
                             f"than {self.min_residency_s:g} s")
            if not self._may_evict(now, len(evict) + 1):
                raise NotYet(f"{self.max_evictions_per_min} workers were evicted in the last "
                             "minute")
            evict.append(victim)
        for victim in evict:
            victim.state = "stopping"
            self.counters["worker_evictions"] += 1
            self._evicted_at.append(now)
        key = self.key_of(tenant)
        handle = WorkerHandle(key, key if key.startswith(SHARED) else tenant, started=now,
                              last_used=now)
        self.workers[handle.key] = handle
        self.counters["worker_starts"] += 1
        return handle, evict

    def idle(self) -> list[WorkerHandle]:
        """Workers idle past the timeout (marked stopping)."""
        now = self.clock()
        stale = [h for h in self.workers.values()
                 if h.state == "ready" and not h.inflight and not self.is_pinned(h.key)
                 and now - h.last_used > self.idle_s]
        for handle in stale:
            handle.state = "stopping"
            self.counters["worker_evictions"] += 1
        return stale

    def forget(self, key: str, request_ids: list[str]) -> None:
        """Requests no longer wait for, or run in, worker `key` (they were aborted)."""
        handle = self.workers.get(key)
        if handle is None:
            return
        for request_id in request_ids:
            handle.inflight.pop(request_id, None)
            handle.pending.pop(request_id, None)

    def infos(self) -> list[W.WorkerInfo]:
        """Each worker as `/status` describes it."""
        now = self.clock()
        return [W.WorkerInfo(h.key, h.tenant, sorted(h.models), h.pid, h.state, len(h.inflight),
                             now - h.last_used, self.is_pinned(h.key), h.adapters, h.threads)
                for h in self.workers.values()]

    def remove(self, key: str) -> WorkerHandle | None:
        return self.workers.pop(key, None)

    def by_pid(self, pid: int) -> WorkerHandle | None:
        return next((h for h in self.workers.values() if h.pid == pid), None)

    def _lru_victim(self, exclude: list[WorkerHandle], now: float) -> WorkerHandle | None:
        """The least recently used evictable worker: idle, not pinned, of age by `now`."""
        candidates = [h for h in self.workers.values()
                      if h.state == "ready" and not h.inflight and not self.is_pinned(h.key)
                      and h not in exclude and now - h.started >= self.min_residency_s]
        return min(candidates, key=lambda h: h.last_used, default=None)

    def _may_evict(self, now: float, more: int) -> bool:
        while self._evicted_at and now - self._evicted_at[0] > 60.0:
            self._evicted_at.popleft()
        return not self.max_evictions_per_min or \
            len(self._evicted_at) + more <= self.max_evictions_per_min

"""Worker pool bookkeeping with a fake clock: LRU eviction, pinning, idle timeout, capacity."""

from __future__ import annotations

import pytest

from workers.manager.pool import NoCapacity, NotYet, WorkerPool, worker_key


class Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


def ready(pool: WorkerPool, tenant: str, model: str):
    handle, evicted = pool.add(tenant, model)
    handle.state = "ready"
    return handle, evicted


def test_least_recently_used_idle_worker_makes_room() -> None:
    clock = Clock()
    pool = WorkerPool(max_workers=2, clock=clock)
    ready(pool, "a", "m1")
    clock.now = 1
    ready(pool, "b", "m2")
    clock.now = 2
    pool.get("a", "m1")  # a is now more recent than b
    clock.now = 3
    _, evicted = ready(pool, "c", "m3")
    assert [h.key for h in evicted] == [worker_key("b", "m2")]
    assert evicted[0].state == "stopping"
    assert pool.counters["worker_evictions"] == 1


def test_busy_and_pinned_workers_are_never_evicted() -> None:
    clock = Clock()
    pool = WorkerPool(max_workers=2, pinned={worker_key("a", "m1")}, clock=clock)
    ready(pool, "a", "m1")
    busy, _ = ready(pool, "b", "m2")
    busy.inflight.add("request-1")
    with pytest.raises(NoCapacity):
        pool.add("c", "m3")
    busy.inflight.clear()
    _, evicted = ready(pool, "c", "m3")
    assert [h.key for h in evicted] == [worker_key("b", "m2")]


def test_idle_timeout_spares_pinned_and_busy_workers() -> None:
    clock = Clock()
    pool = WorkerPool(max_workers=8, idle_s=10, pinned={worker_key("p", "m")}, clock=clock)
    ready(pool, "p", "m")
    ready(pool, "idle", "m")
    busy, _ = ready(pool, "busy", "m")
    busy.inflight.add("r")
    clock.now = 11
    assert [h.tenant for h in pool.idle()] == ["idle"]
    assert pool.idle() == []


def test_no_worker_is_evicted_before_its_minimum_residency() -> None:
    clock = Clock()
    pool = WorkerPool(max_workers=1, min_residency_s=5, clock=clock)
    ready(pool, "a", "m1")
    clock.now = 4.9
    with pytest.raises(NotYet):
        pool.add("b", "m2")
    clock.now = 5.0
    _, evicted = ready(pool, "b", "m2")
    assert [h.key for h in evicted] == [worker_key("a", "m1")]


def test_the_eviction_rate_is_capped() -> None:
    clock = Clock()
    pool = WorkerPool(max_workers=1, max_evictions_per_min=2, clock=clock)
    ready(pool, "t", "m0")
    for i in (1, 2):
        clock.now = i
        ready(pool, "t", f"m{i}")
    clock.now = 3
    with pytest.raises(NotYet):
        pool.add("t", "m3")
    clock.now = 61.5  # the first eviction (at 1 s) is over a minute old
    _, evicted = ready(pool, "t", "m3")
    assert [h.key for h in evicted] == [worker_key("t", "m2")]


def test_busy_workers_mean_a_wait_and_pinned_ones_no_capacity() -> None:
    pool = WorkerPool(max_workers=1, min_residency_s=5, clock=Clock())
    busy, _ = ready(pool, "a", "m1")
    busy.inflight.add("r")
    with pytest.raises(NotYet):
        pool.add("b", "m2")
    pinned = WorkerPool(max_workers=1, pinned={worker_key("a", "m1")}, clock=Clock())
    ready(pinned, "a", "m1")
    with pytest.raises(NoCapacity) as info:
        pinned.add("b", "m2")
    assert not isinstance(info.value, NotYet)

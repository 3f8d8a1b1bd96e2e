"""Worker pool bookkeeping with a fake clock: one worker per tenant, LRU eviction, pinning, idle
timeout, capacity; an aborted request taken out of a starting worker's queue and out of the
waiting room for a slot, the others kept in their order."""

from __future__ import annotations

import pytest

from wire import manager as W
from workers.manager.admission import Admission
from workers.manager.config import ManagerConfig
from workers.manager.pool import NoCapacity, NotYet, WorkerPool, model_key


class Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


def ready(pool: WorkerPool, tenant: str):
    handle, evicted = pool.add(tenant)
    handle.state = "ready"
    return handle, evicted


def test_a_tenant_has_one_worker_for_all_its_models() -> None:
    pool = WorkerPool(max_workers=2, clock=Clock())
    handle, _ = ready(pool, "a")
    assert pool.get("a") is handle and handle.key == "a"
    assert pool.get("b") is None
    assert model_key("a", "a/x@1") != model_key("a", "a/x@2")  # breakers stay per version


def test_least_recently_used_idle_worker_makes_room() -> None:
    clock = Clock()
    pool = WorkerPool(max_workers=2, clock=clock)
    ready(pool, "a")
    clock.now = 1
    ready(pool, "b")
    clock.now = 2
    pool.get("a")  # a is now more recent than b
    clock.now = 3
    _, evicted = ready(pool, "c")
    assert [h.key for h in evicted] == ["b"]
    assert evicted[0].state == "stopping"
    assert pool.counters["worker_evictions"] == 1


def test_busy_and_pinned_workers_are_never_evicted() -> None:
    clock = Clock()
    pool = WorkerPool(max_workers=2, pinned={"a|a/m1"}, clock=clock)
    ready(pool, "a")
    busy, _ = ready(pool, "b")
    busy.inflight["request-1"] = "b/m2@1"
    with pytest.raises(NoCapacity):
        pool.add("c")
    busy.inflight.clear()
    _, evicted = ready(pool, "c")
    assert [h.key for h in evicted] == ["b"]


def test_idle_timeout_spares_pinned_and_busy_workers() -> None:
    clock = Clock()
    pool = WorkerPool(max_workers=8, idle_s=10, pinned={"p|m"}, clock=clock)
    ready(pool, "p")
    ready(pool, "idle")
    busy, _ = ready(pool, "busy")
    busy.inflight["r"] = "m"
    clock.now = 11
    assert [h.tenant for h in pool.idle()] == ["idle"]
    assert pool.idle() == []


def test_no_worker_is_evicted_before_its_minimum_residency() -> None:
    clock = Clock()
    pool = WorkerPool(max_workers=1, min_residency_s=5, clock=clock)
    ready(pool, "a")
    clock.now = 4.9
    with pytest.raises(NotYet):
        pool.add("b")
    clock.now = 5.0
    _, evicted = ready(pool, "b")
    assert [h.key for h in evicted] == ["a"]


def test_the_eviction_rate_is_capped() -> None:
    clock = Clock()
    pool = WorkerPool(max_workers=1, max_evictions_per_min=2, clock=clock)
    ready(pool, "t0")
    for i in (1, 2):
        clock.now = i
        ready(pool, f"t{i}")
    clock.now = 3
    with pytest.raises(NotYet):
        pool.add("t3")
    clock.now = 61.5  # the first eviction (at 1 s) is over a minute old
    _, evicted = ready(pool, "t3")
    assert [h.key for h in evicted] == ["t2"]


def test_busy_workers_mean_a_wait_and_pinned_ones_no_capacity() -> None:
    pool = WorkerPool(max_workers=1, min_residency_s=5, clock=Clock())
    busy, _ = ready(pool, "a")
    busy.inflight["r"] = "m"
    with pytest.raises(NotYet):
        pool.add("b")
    pinned = WorkerPool(max_workers=1, pinned={"a"}, clock=Clock())
    ready(pinned, "a")
    with pytest.raises(NoCapacity) as info:
        pinned.add("b")
    assert not isinstance(info.value, NotYet)


def test_tenants_that_share_are_served_by_the_shared_pool() -> None:
    sharing = frozenset({"s1", "s2", "s3", "s4"})
    pool = WorkerPool(max_workers=4, shared_workers=2, shared_tenants=sharing,
                      pinned={"s2|s2/x"}, clock=Clock())
    keys = {tenant: pool.key_of(tenant) for tenant in (*sharing, "own")}
    assert keys["own"] == "own"
    assert {keys[t] for t in sharing} == {"~shared-0", "~shared-1"}  # both used
    assert WorkerPool(shared_workers=2, shared_tenants=frozenset({"s1"})).key_of("s1") == \
        keys["s1"]  # stable: a tenant's adapters stay in one worker
    shared, _ = ready(pool, "s1")
    assert shared.key == keys["s1"] and shared.tenant == keys["s1"]
    same = [t for t in sharing - {"s1"} if keys[t] == keys["s1"]]
    assert same and all(pool.get(t) is shared for t in same)  # no worker of their own
    assert pool.is_pinned(keys["s2"]) and not pool.is_pinned("own")
    everyone = WorkerPool(shared_workers=1, shared_tenants=frozenset({"*"}))
    assert everyone.key_of("any") == everyone.key_of("other") == "~shared-0"
    assert WorkerPool(shared_tenants=frozenset({"*"})).key_of("any") == "any"  # no pool: own


def test_an_aborted_request_leaves_the_queues_it_waits_in_the_rest_in_order() -> None:
    """Every other one of a request's 2,048 prompts aborted, one by one (by id: no pass over
    what waits for each)."""
    asked = [W.Generate(f"r{i}", "a", "tiny-llama", W.SamplingParams()) for i in range(2048)]
    pool, room = WorkerPool(max_workers=1, clock=Clock()), Admission(ManagerConfig())
    handle, _ = pool.add("a")  # starting: its requests wait for its Ready
    for request in asked:
        handle.inflight[request.id] = model_key("a", request.model)
        handle.pending[request.id] = request
        assert room.wait(b"gateway", request, 1, None, NotYet("no slot yet")) is None
    for request in asked[1::2]:
        pool.forget(handle.key, [request.id])
        room.forget(request.id)
    assert list(handle.pending.values()) == asked[::2] and list(handle.inflight) == \
        [r.id for r in asked[::2]]
    assert [waiting[1] for waiting in room.due()] == asked[::2] and room.due() == []

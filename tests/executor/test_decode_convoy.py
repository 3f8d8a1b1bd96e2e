"""A decode step's convoy, driven by a fake clock: it waits, up to the cap, for the decoding
tenants that call at its layer lately and are behind it in the pass, or idle and due there."""

from __future__ import annotations

import pytest

from executor.policy import Opportunistic
from executor.readiness import queue_waits
from tests.executor.queued import BUDGETS, call, clients_of, scheduler, walk_with_gaps
from tests.executor.test_scheduler import teach_layer_order


def test_a_decode_step_waits_for_a_decode_client_queued_behind_it(clock) -> None:
    s = scheduler(Opportunistic(BUDGETS), clock)
    teach_layer_order(s, ["b", "c"])  # both sit idle after layer 0: expected at layer 1
    ahead = call(s, "a", 2)
    clock.advance(0.001)  # past the budget of a's decode step
    call(s, "b", 1)  # behind a in the pass, and waiting for c
    assert s.next_batch() is None  # a waits for b, who will come after layer 1
    assert 0 < s.ready_in() < 0.001  # until b's budget for c runs out
    assert ahead.deadline < clock.now
    call(s, "c", 1)
    assert clients_of(s.next_batch()) == ["b", "c"]
    call(s, "b", 2)
    assert clients_of(s.next_batch()) == ["a", "b"]  # one batch for both
    call(s, "a", 1)
    call(s, "c", 0)  # behind a, but a prefill's next step is no decode step
    clock.advance(BUDGETS.max_wait_s)
    assert clients_of(s.next_batch()) == ["c"]
    assert clients_of(s.next_batch()) == ["a"]  # never longer than the cap


def test_a_decode_step_waits_only_for_clients_that_call_at_its_layer(clock) -> None:
    s = scheduler(Opportunistic(BUDGETS), clock)
    teach_layer_order(s, ["b"])  # b has decoded through layers 0, 1 and 2
    for layer in (0, 1):  # c through 0 and 1 only: say its adapter takes other layers after
        call(s, "c", layer)
        clock.advance(0.001)  # past its own budget (b may be coming to layer 1)
        assert clients_of(s.next_batch()) == ["c"]
    call(s, "a", 2)
    call(s, "c", 0)  # behind a in the pass, but it never comes to layer 2
    clock.advance(0.001)  # past a's own budget

    def wait_of(client: str) -> float:
        return next(w for q, w in queue_waits(s, clock.now) if q[0].client == client.encode())

    assert wait_of("a") <= 0
    call(s, "b", 0)  # behind a too, and it comes there
    assert wait_of("a") == pytest.approx(BUDGETS.max_wait_s - 0.001)


def test_a_decode_step_stops_waiting_for_a_client_that_left_its_layer(clock) -> None:
    """Two passes after it last called there (`Presence.called_lately`)."""
    s = scheduler(Opportunistic(BUDGETS), clock)

    def walk(client: str, layers: tuple[int, ...]) -> None:
        for layer in layers:
            call(s, client, layer)
            clock.advance(0.001)  # past its own budget
            assert clients_of(s.next_batch()) == [client]

    def wait_of(client: str) -> float:
        return next(w for q, w in queue_waits(s, clock.now) if q[0].client == client.encode())

    walk("c", (0, 1, 2, 0, 1, 2))  # c decoded through layers 0, 1 and 2
    walk("c", (0, 1))  # then its adapters moved it off layer 2 (say, onto the projections)
    call(s, "a", 2)
    call(s, "c", 0)  # behind a: within two passes it may still come (routes vary by step)
    clock.advance(0.001)
    assert wait_of("a") == pytest.approx(BUDGETS.max_wait_s - 0.001)
    clock.advance(BUDGETS.max_wait_s)
    assert clients_of(s.next_batch()) == ["c"]
    assert clients_of(s.next_batch()) == ["a"]
    walk("c", (1, 0, 1))  # its second pass without layer 2
    call(s, "a", 2)
    call(s, "c", 0)  # behind a again, but it no longer comes there: a waits for no one
    clock.advance(0.001)
    assert wait_of("a") <= 0


def test_a_decode_step_waits_for_an_idle_client_due_within_twice_its_gap(clock) -> None:
    s = scheduler(Opportunistic(BUDGETS), clock)
    walk_with_gaps(s, clock)  # a and b walk layers 0 -> 1; each calls 2 ms after its reply
    call(s, "a", 0)  # b is due at layer 0 until 2 x 2 ms + 0.2 ms after its last reply
    clock.advance(0.0015)  # far past a's own budget (0.3 ms + a tiny matmul)
    assert s.next_batch() is None
    assert s.ready_in() == pytest.approx(0.0007)
    call(s, "b", 0)
    batch = s.next_batch()
    assert clients_of(batch) == ["a", "b"]
    s.observe(batch, 0.001)
    call(s, "a", 1)
    clock.advance(0.004)
    assert s.next_batch() is None  # b is due at layer 1 until 4.2 ms after its reply
    clock.advance(0.0003)
    assert clients_of(s.next_batch()) == ["a"]  # b never came: a runs without it

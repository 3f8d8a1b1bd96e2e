"""A call that carries its tenants' latency target never waits longer than it for company: not
for a joiner within the policy's budget, not for its convoy, unless running apart would cost
more than the convoy's wait (fake clock, in-process scheduler)."""

from __future__ import annotations

import pytest

from executor.policy import Lockstep, Opportunistic
from tests.executor.queued import BUDGETS, call, clients_of, scheduler, walk_with_gaps
from tests.executor.test_scheduler import teach_layer_order
from wire.call.messages import Op


def test_a_call_waits_for_a_joiner_no_longer_than_its_target(clock) -> None:
    s = scheduler(Opportunistic(BUDGETS), clock)
    teach_layer_order(s, ["a", "b"])  # b sits after layer 0: expected at layer 1
    first = call(s, "a", 1, decode_us=100)
    assert s.next_batch() is None
    assert s.ready_in() == pytest.approx(0.0001)  # not the 0.3 ms and more of its budget
    assert first.deadline - clock.now == pytest.approx(0.0001)
    clock.advance(0.00011)
    assert clients_of(s.next_batch()) == ["a"]
    loose = call(s, "a", 1, decode_us=50_000)  # a looser target than the budget: the budget
    assert 0.0003 <= loose.deadline - clock.now < 0.001


def test_a_decode_step_waits_for_its_convoy_no_longer_than_its_target(clock) -> None:
    s = scheduler(Opportunistic(BUDGETS), clock)
    walk_with_gaps(s, clock)  # a and b walk layers 0 -> 1; each calls 2 ms after its reply
    call(s, "a", 0, decode_us=1500)  # b is due at layer 0 for 2.2 ms more (the convoy)
    assert s.next_batch() is None
    assert s.ready_in() == pytest.approx(0.0015)  # a waits for b only as long as it asked
    clock.advance(0.00151)
    assert clients_of(s.next_batch()) == ["a"]
    call(s, "a", 0, decode_us=0)  # none of its own: it waits for b as before, until b's due
    assert s.next_batch() is None
    assert s.ready_in() == pytest.approx(0.0022 - 0.00151)


def test_a_convoy_waits_as_long_as_a_batch_apart_would_cost(clock) -> None:
    s = scheduler(Opportunistic(BUDGETS), clock)
    walk_with_gaps(s, clock)  # decode batches of a and b took 1 ms a layer
    assert s.cost.decode_batch_s((0, Op.FORWARD)) == pytest.approx(0.001)
    call(s, "a", 0, decode_us=100)  # b is due for 2.2 ms more
    assert s.next_batch() is None
    assert s.ready_in() == pytest.approx(0.001)  # not 0.1 ms: apart, a's step costs 1 ms more
    clock.advance(0.00101)
    assert clients_of(s.next_batch()) == ["a"]
    s.observe([call(s, "a", 0, rows=64)], 0.05)  # a prefill's batch is no decode batch's cost
    assert s.cost.decode_batch_s((0, Op.FORWARD)) == pytest.approx(0.001)
    # nor a packed step's (a decode step with a prompt's chunk: its rows are no skinny matmul)
    s.observe([call(s, "a", 0, rows=4 + 256, decode=True)], 0.05)
    assert s.cost.decode_batch_s((0, Op.FORWARD)) == pytest.approx(0.001)


def test_every_policy_keeps_the_target(clock) -> None:
    s = scheduler(Lockstep(cap_s=0.1), clock)
    teach_layer_order(s, ["a", "b"])
    call(s, "a", 1, decode_us=500)  # lockstep would wait for b up to its 100 ms cap
    clock.advance(0.0004)
    assert s.next_batch() is None
    clock.advance(0.00011)
    assert clients_of(s.next_batch()) == ["a"]


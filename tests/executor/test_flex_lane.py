"""Flex requests' calls (`Lane.FLEX`, a worker's steps of flex requests only: `Call.flex`): in a
lane of their own whatever their rows, run after every other inference call, held while a
decode step is about to come (up to starving), and no decode step's company to wait for; a real
executor process counts them in the flex lane, through the doorbell or over the socket."""

from __future__ import annotations

import pytest
import torch

from executor.calls import PendingCall, lane_for
from executor.lanes import Lane
from executor.policy import Opportunistic
from tests.executor.queued import BUDGETS, INF, TRAIN, call, scheduler, walk_with_gaps
from tests.executor.test_scheduler import teach_layer_order
from tests.helpers import ExecutorProcess
from wire.call import header as H
from wire.call import messages as P
from workers.remote.client import ExecutorClient
from workers.remote.handle import decode_step, flex_step, marks


def flex(s, client: str, layer: int, rows: int = 1, decode: bool = True) -> PendingCall:
    pending = PendingCall(client.encode(), P.Call(0, P.Op.FORWARD, layer, INF, "float32",
                                                  (rows, 1), decode=decode, flex=True),
                          torch.empty(rows, 1), s.clock())
    s.add(pending)
    return pending


def test_a_flex_call_is_in_the_flex_lane_whatever_its_rows_and_marks() -> None:
    assert [lane_for(INF, 1, True, True), lane_for(INF, 64, False, True),
            lane_for(INF, 1, True, False), lane_for(TRAIN, 1, False, True)] == [
        Lane.FLEX, Lane.FLEX, Lane.DECODE, Lane.TRAINING]


def test_a_flex_call_runs_after_a_prefill_and_a_decode_step(clock) -> None:
    s = scheduler(Opportunistic(BUDGETS), clock)
    late = flex(s, "f", 0)
    prefill = call(s, "p", 1, rows=64)
    step = call(s, "d", 2, decode=True)
    clock.advance(BUDGETS.max_wait_s)  # every budget spent: all three ready
    assert [s.next_batch() for _ in range(3)] == [[step], [prefill], [late]]


def test_a_flex_call_is_held_while_a_decode_step_is_due_up_to_starving(clock) -> None:
    s = scheduler(Opportunistic(BUDGETS), clock)
    walk_with_gaps(s, clock)  # a and b decode through layers 0 and 1, due 2 ms after a reply
    held = flex(s, "f", 2)  # at a layer they never take
    for step in range(200):  # 2 ms a step: past the starvation bound, 0.2 s
        taken = s.next_batch()  # between their steps: held while they are due
        if taken is not None:
            break
        batch = [call(s, "a", step % 2), call(s, "b", step % 2)]
        assert s.next_batch() == batch
        s.observe(batch, 0.001)
        clock.advance(0.002)
    assert taken == [held]  # once starving, in a gap (else it would come before their step)
    assert s.starvation_s <= clock.now - held.arrived < s.starvation_s + 0.004
    clock.advance(0.1)  # a and b pause (between requests): due nowhere
    while s.next_batch() is not None:  # their last step, if it was queued
        pass
    idle = flex(s, "f", 2)
    clock.advance(BUDGETS.max_wait_s)
    assert s.next_batch() == [idle]


def test_a_decode_step_does_not_wait_for_a_flex_client_behind_it(clock) -> None:
    s = scheduler(Opportunistic(BUDGETS), clock)
    teach_layer_order(s, ["b"])  # as a decode client, b would be worth waiting for
    ahead = call(s, "a", 2, decode=True)
    flex(s, "b", 1)  # behind a in the pass, but its rows are flex requests'
    clock.advance(0.001)  # past the budget of a's decode step
    assert s.next_batch() == [ahead]


def test_marks_name_a_decode_step_and_flex_rows() -> None:
    assert marks() == 0
    with decode_step(), flex_step(True):
        assert marks() == H.DECODE | H.FLEX
        with flex_step(False):
            assert marks() == H.DECODE
    assert marks() == 0


@pytest.mark.parametrize("doorbell", [True, False], ids=["doorbell", "socket"])
def test_an_executor_process_counts_flex_calls_in_their_lane(executor_for,
                                                             doorbell: bool) -> None:
    llama: ExecutorProcess = executor_for("tiny-llama")
    client = ExecutorClient(llama.endpoint, name=f"flex-{doorbell}", use_doorbell=doorbell)
    try:
        assert (client._fast is not None) == doorbell  # the path this case is about
        x = torch.randn(1, 64)
        before = {lane: f.calls for lane, f in client.stats().lanes.items()}
        expected = client.call(P.Op.FORWARD, 1, x, INF).clone()
        with flex_step(True):
            for _ in range(3):
                assert torch.equal(client.call(P.Op.FORWARD, 1, x, INF), expected)
        after = {lane: f.calls for lane, f in client.stats().lanes.items()}
        assert {lane: after[lane] - before[lane] for lane in after} == {
            "decode": 1, "prefill": 0, "training": 0, "flex": 3}
    finally:
        client.close()

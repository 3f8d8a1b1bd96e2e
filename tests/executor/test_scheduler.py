"""The batching policies, driven by a fake clock: budgets, joiners, priority, cap, fairness."""

from __future__ import annotations

import pytest

from executor.policy import Eager, Lockstep, Opportunistic
from executor.readiness import TRAINING_CONVOY_ROWS
from executor.scheduler import TWIN_TURN_S, Scheduler
from executor.share import TWIN_HOLD_S, TrainingShare
from executor.twin_ledger import TwinLedger
from tests.executor.queued import BUDGETS, INF, TRAIN, call, clients_of, scheduler
from wire.call.messages import Op


def teach_layer_order(s: Scheduler, clients: list[str]) -> None:
    """Every client calls layers 0, 1 and 2 once (its route: a client is waited for where it
    calls); afterwards each sits idle after layer 0."""
    for layer in (0, 1, 2):
        for name in clients:
            call(s, name, layer)
        while s.next_batch():
            pass
    for name in clients:
        call(s, name, 0)
    while s.next_batch():
        pass


def test_eager_runs_at_once_and_batches_what_is_queued(clock) -> None:
    s = scheduler(Eager(), clock)
    call(s, "a", 0)
    call(s, "b", 0)
    call(s, "c", 1)
    assert s.ready_in() == 0.0
    assert clients_of(s.next_batch()) == ["a", "b"]
    assert clients_of(s.next_batch()) == ["c"]
    assert s.next_batch() is None and s.ready_in() is None


def test_opportunistic_never_waits_when_no_one_can_join(clock) -> None:
    s = scheduler(Opportunistic(BUDGETS), clock)
    call(s, "solo", 0)
    assert clients_of(s.next_batch()) == ["solo"]


def test_opportunistic_waits_for_an_expected_joiner_within_budget(clock) -> None:
    s = scheduler(Opportunistic(BUDGETS), clock)
    teach_layer_order(s, ["a", "b"])
    first = call(s, "a", 1)  # b sits after layer 0, so it is expected at layer 1
    assert s.next_batch() is None
    wait = s.ready_in()
    assert 0.0003 <= wait < 0.001  # decode: base 0.3 ms + a quarter of a tiny matmul
    assert first.deadline - clock.now == pytest.approx(wait)
    clock.advance(wait / 2)
    call(s, "b", 1)
    assert clients_of(s.next_batch()) == ["a", "b"]  # nobody else to wait for: runs at once


def test_budget_expires_without_the_joiner(clock) -> None:
    s = scheduler(Opportunistic(BUDGETS), clock)
    teach_layer_order(s, ["a", "b"])
    call(s, "a", 1)
    clock.advance(s.ready_in())
    assert clients_of(s.next_batch()) == ["a"]


def test_budget_grows_with_size_and_kind_and_is_capped(clock) -> None:
    s = scheduler(Opportunistic(BUDGETS), clock)
    decode = call(s, "a", 0, rows=1, kind=INF)
    prefill = call(s, "b", 1, rows=512, kind=INF)
    train = call(s, "c", 2, rows=512, kind=TRAIN)
    assert decode.deadline < prefill.deadline < train.deadline
    huge = call(s, "d", 0, rows=10**7, kind=TRAIN)
    assert huge.deadline - huge.arrived == pytest.approx(BUDGETS.max_wait_s)


def test_cost_model_learns_from_measured_batches(clock) -> None:
    s = scheduler(Opportunistic(BUDGETS), clock)
    before = s.cost.estimate((0, Op.FORWARD), 100, 64 * 64)
    batch = [call(s, "a", 0, rows=100)]
    s.next_batch()
    s.observe(batch, 0.010)  # much slower than the prior
    assert s.cost.estimate((0, Op.FORWARD), 100, 64 * 64) > 10 * before


def test_inference_first_but_training_keeps_its_share(clock) -> None:
    s = scheduler(Eager(), clock, training_share=0.25)
    served = []
    for i in range(80):  # both kinds always have work queued; one batch runs per round
        clock.advance(0.001)
        call(s, f"decoder-{i}", 1, kind=INF)
        if not s.queues.get((0, Op.BACKWARD)):
            call(s, "trainer", 0, rows=64, kind=TRAIN, op=Op.BACKWARD)
        batch = s.next_batch()
        s.observe(batch, 0.002)  # each batch computes as long: a batch's share is its time's
        served.append(batch[0].kind)
    assert served[0] == TRAIN  # nothing served yet: training is below its share
    assert 0.2 <= served.count(TRAIN) / len(served) <= 0.3
    assert served[1] == INF


def test_decode_batches_run_while_training_had_nothing_queued_do_not_count_against_it(
        clock) -> None:
    s = scheduler(Eager(), clock, training_share=0.25)
    call(s, "trainer", 0, rows=64, kind=TRAIN)
    batch = s.next_batch()
    assert batch[0].kind == TRAIN
    s.observe(batch, 0.004)
    for _ in range(20):  # the trainer computes its own part meanwhile
        call(s, "decoder", 1)
        batch = s.next_batch()
        assert batch[0].kind == INF
        s.observe(batch, 0.004)
    call(s, "trainer", 0, rows=64, kind=TRAIN)
    clock.advance(0.001)
    call(s, "decoder", 1)
    batch = s.next_batch()
    assert batch[0].kind == INF  # training still has its share: inference first
    s.observe(batch, 0.004)
    assert s.share.of_recent() == 0.5


def test_inference_leaves_the_host_to_an_idle_twin_owed_its_share(clock) -> None:
    """With the jobs on the idle twin, the serving executor counts the twin's compute seconds as
    training's (`TwinLedger`): while the twin has work and less than its share, inference
    batches wait their turn (the twin takes the host meanwhile), up to starving."""
    ledger, cpu = TwinLedger(), [0.0]
    twin = TrainingShare(0.25, tell=ledger, cpu=lambda: cpu[0])  # the twin's own
    s = scheduler(Eager(), clock, share=TrainingShare(0.25, twin=ledger), starvation_s=0.2)
    call(s, "decoder", 1)
    s.observe(s.next_batch(), 0.004)  # the twin has no work: inference as ever, not counted
    twin.queued = 1  # a training call came to the twin
    call(s, "decoder", 1)
    assert s.next_batch() is None and s.ready_in() == pytest.approx(TWIN_TURN_S)
    twin.queued, _ = 0, twin.start(training=True)  # the twin runs it: 5 ms, on the host
    cpu[0] += 0.005
    twin.ran(training=True, seconds=0.005)
    twin.queued = 1  # and has its next
    decoded = 0
    while (batch := s.next_batch()) is not None:
        s.observe(batch, 0.004)
        decoded += 1
        call(s, "decoder", 1)
    assert decoded == 4 and s.share.of_recent() == pytest.approx(0.005 / 0.021)  # < 0.25
    clock.advance(0.2)  # the decode step starves: it goes, owed or not
    assert s.next_batch()[0].kind == INF
    twin.queued = 0  # the twin has nothing left: inference runs at once
    call(s, "decoder", 1)
    assert s.next_batch() is not None


def test_the_idle_twins_training_leaves_the_host_to_inference_until_owed(clock) -> None:
    """Each inference batch of the serving executor holds the twin's training a moment
    (all of `TWIN_HOLD_S` here, training well above its floor; through the ledger: nice 19
    leaves the tenants the cores, not the memory bandwidth a twin's batch takes beside
    theirs), until training is owed its floor."""
    ledger, cpu = TwinLedger(), [0.0]
    serving = scheduler(Eager(), clock, share=TrainingShare(0.25, twin=ledger))
    twin = scheduler(Eager(), clock, share=TrainingShare(0.25, tell=ledger, cpu=lambda: cpu[0]))
    call(twin, "trainer", 0, rows=8, kind=TRAIN)
    batch = twin.next_batch()  # no inference: training runs at once
    cpu[0] += 0.005
    twin.observe(batch, 0.005)
    call(serving, "decoder", 1)
    serving.observe(serving.next_batch(), 0.004)
    call(twin, "trainer", 0, rows=8, kind=TRAIN)
    assert twin.next_batch() is None and twin.ready_in() == pytest.approx(TWIN_HOLD_S)
    clock.advance(TWIN_HOLD_S / 2)
    call(serving, "decoder", 1)
    serving.observe(serving.next_batch(), 0.004)  # inference again: held anew
    assert twin.next_batch() is None and twin.ready_in() == pytest.approx(TWIN_HOLD_S)
    clock.advance(TWIN_HOLD_S)
    assert twin.next_batch() is not None  # the host left to it: it runs
    call(twin, "trainer", 0, rows=8, kind=TRAIN)
    call(serving, "decoder", 1)
    decoded = 0
    while (batch := serving.next_batch()) is not None:  # while training keeps its floor
        serving.observe(batch, 0.004)
        decoded += 1
        call(serving, "decoder", 1)
        assert twin.next_batch() is None
    assert decoded == 3 and serving.share.of_recent() < 0.25  # owed: the twin goes at once
    assert twin.next_batch() is not None


def test_a_starving_call_goes_first(clock) -> None:
    s = scheduler(Eager(), clock, training_share=0.0001, starvation_s=0.2)
    old = call(s, "trainer", 0, rows=64, kind=TRAIN)
    clock.advance(0.25)
    call(s, "decoder", 1, kind=INF)
    assert s.next_batch() == [old]


def test_round_robin_keeps_a_flooding_client_from_crowding_others_out(clock) -> None:
    s = scheduler(Eager(), clock, max_batch_rows=100)
    for _ in range(20):
        call(s, "flood", 0, rows=10)
    call(s, "victim", 0, rows=10)
    first = clients_of(s.next_batch())
    assert "victim" in first and len(first) <= 10
    assert sum(1 for _ in range(20) if s.next_batch()) >= 1


def test_lockstep_waits_for_every_active_client_or_the_cap(clock) -> None:
    s = scheduler(Lockstep(cap_s=0.05), clock)
    teach_layer_order(s, ["a", "b", "c"])
    call(s, "a", 1)
    call(s, "b", 1)
    assert s.next_batch() is None  # c is active but not here yet
    call(s, "c", 1)
    assert sorted(clients_of(s.next_batch())) == ["a", "b", "c"]
    call(s, "a", 0)
    clock.advance(0.05)
    assert clients_of(s.next_batch()) == ["a"]  # cap reached


def test_lockstep_groups_at_two_layers_do_not_stall_each_other(clock) -> None:
    s = scheduler(Lockstep(cap_s=0.05), clock)
    teach_layer_order(s, ["a", "b"])
    call(s, "a", 1)
    call(s, "b", 0)  # every active client waits somewhere: waiting longer would only stall
    assert clients_of(s.next_batch()) == ["b"]  # the one behind first
    assert s.next_batch() is None  # now b is free and comes to layer 1: a waits for it
    call(s, "b", 1)
    assert sorted(clients_of(s.next_batch())) == ["a", "b"]


def test_departed_clients_are_not_waited_for(clock) -> None:
    s = scheduler(Opportunistic(BUDGETS), clock)
    teach_layer_order(s, ["a", "b"])
    clock.advance(1.0)  # b has been silent longer than the active window
    call(s, "a", 1)
    assert clients_of(s.next_batch()) == ["a"]


def test_a_client_that_said_goodbye_is_not_waited_for(clock) -> None:
    s = scheduler(Opportunistic(BUDGETS), clock)
    teach_layer_order(s, ["a", "b", "c"])
    s.depart(b"b")  # its goodbye, or its doorbell hung up, within the active window
    call(s, "a", 1)
    assert s.next_batch() is None  # c may still come
    call(s, "c", 1)
    assert clients_of(s.next_batch()) == ["a", "c"]  # at once: b will not
    call(s, "b", 1)  # a client calling again under that identity is active again
    assert clients_of(s.next_batch()) == ["b"]


def test_opportunistic_runs_decode_steps_before_a_prefill_until_it_starves(clock) -> None:
    s = scheduler(Opportunistic(BUDGETS), clock, starvation_s=0.2)
    prefill = call(s, "prefill", 0, rows=128)
    decode = call(s, "decoder", 1, rows=1)  # further in the model: farthest-behind picks 0
    clock.advance(0.001)
    assert s.next_batch() == [decode]
    assert s.next_batch() == [prefill]
    prefill = call(s, "prefill", 0, rows=128)
    clock.advance(0.25)  # waited past the starvation bound
    decode = call(s, "decoder", 1, rows=1)
    assert s.next_batch() == [prefill]
    eager = scheduler(Eager(), clock)
    first = call(eager, "prefill", 0, rows=128)
    call(eager, "decoder", 1, rows=1)
    assert eager.next_batch() == [first]  # eager: first come, first served


def test_opportunistic_runs_small_steps_training_calls_before_large_ones(clock) -> None:
    s = scheduler(Opportunistic(BUDGETS), clock, starvation_s=0.2)
    large = call(s, "large", 0, rows=TRAINING_CONVOY_ROWS, kind=TRAIN)
    small = call(s, "small", 2, rows=32, kind=TRAIN)  # further on: farthest-behind picks 0
    clock.advance(BUDGETS.max_wait_s)  # past both calls' waits
    assert s.next_batch() == [small]
    assert s.next_batch() == [large]
    below = call(s, "large", 0, rows=TRAINING_CONVOY_ROWS - 1, kind=TRAIN)  # its last step's
    small = call(s, "small", 2, rows=32, kind=TRAIN)
    clock.advance(BUDGETS.max_wait_s)
    assert s.next_batch() == [below]  # both small: farthest behind first, as before
    assert s.next_batch() == [small]
    large = call(s, "large", 0, rows=TRAINING_CONVOY_ROWS, kind=TRAIN)
    clock.advance(0.25)  # waited past the starvation bound
    small = call(s, "small", 2, rows=32, kind=TRAIN)
    assert s.next_batch() == [large]

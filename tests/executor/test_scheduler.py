"""The batching policies, driven by a fake clock: budgets, joiners, priority, cap, fairness."""

from __future__ import annotations

import pytest

from executor.policy import Eager, Lockstep, Opportunistic
from executor.readiness import TRAINING_CONVOY_ROWS, queue_waits
from executor.scheduler import Scheduler
from tests.executor.queued import BUDGETS, INF, TRAIN, call, clients_of, scheduler, walk_with_gaps
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

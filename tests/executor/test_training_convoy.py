"""Training's convoy (`executor.readiness`): under the opportunistic policy a training batch
of fewer than `TRAINING_CONVOY_ROWS` rows waits, up to the policy's `convoy_s`, for every active
trainer that has no call queued (it computes its own part and comes back), so that concurrent
jobs share one batch per layer; never for an inference client, nor while one is active beside
the trainers, nor for a trainer of another shape (it trains through fewer layers or others than
the waiting one, lately; an evaluation's forward counts none) or one that has not called at the
queue's layer lately (an evaluation's, now or an epoch ago) or away well past its usual gaps,
never past the cap, and never under the eager policy."""

from __future__ import annotations

import pytest

from executor.policy import Eager, Opportunistic
from executor.presence import AWAY_GAPS, PAUSE_S
from executor.readiness import TRAINING_CONVOY_ROWS
from executor.scheduler import Scheduler
from tests.executor.queued import BUDGETS, INF, TRAIN, call, clients_of, scheduler
from wire.call.messages import Op


def seen(s: Scheduler, kinds: dict[str, object]) -> None:
    """Each client makes one call of its kind at layer 1, then at layer 2 (so none is expected
    at layers 0-1 next), and the calls run."""
    for layer in (1, 2):
        for name, kind in kinds.items():
            call(s, name, layer, rows=32, kind=kind)
        while s.next_batch():
            pass


def test_a_training_batch_waits_for_a_trainer_computing_then_runs_with_it(clock) -> None:
    s = scheduler(Opportunistic(BUDGETS), clock)
    seen(s, {"a": TRAIN, "b": TRAIN})
    call(s, "a", 1, rows=32, kind=TRAIN)
    assert s.next_batch() is None  # b is active, with nothing queued: it is coming
    assert s.ready_in() == pytest.approx(BUDGETS.max_wait_s)
    clock.advance(0.005)
    assert s.next_batch() is None
    call(s, "b", 1, rows=32, kind=TRAIN)
    assert sorted(clients_of(s.next_batch())) == ["a", "b"]  # one batch, at once


def train_through(s: Scheduler, clock, name: str, layers: tuple[int, ...],
                  head: int | None = None) -> None:
    """`name` calls a forward and a backward at each of `layers` (where its steps train), then a
    forward at `head` (the head's loss, say), each run alone."""
    ops = [(layer, op) for op in (Op.FORWARD, Op.BACKWARD) for layer in layers]
    for layer, op in ops + ([(head, Op.FORWARD)] if head is not None else []):
        call(s, name, layer, rows=32, kind=TRAIN, op=op)
        clock.advance(BUDGETS.max_wait_s)  # whomever it waits for
        assert clients_of(s.next_batch()) == [name]


def test_a_trainer_is_waited_for_only_by_jobs_of_its_shape(clock) -> None:
    s = scheduler(Opportunistic(BUDGETS), clock)
    shapes = {"small": (1,), "twin": (1,), "large": (2,)}  # 1 x 32 steps: say the kept
    for name, layers in shapes.items():  # stretches (1), larger ones the projections (2), and
        train_through(s, clock, name, layers, head=3)  # both the head's loss (3, forward only)
    call(s, "small", 3, rows=32, kind=TRAIN)
    assert s.ready_in() == pytest.approx(BUDGETS.max_wait_s)  # for twin, of its shape
    call(s, "twin", 3, rows=32, kind=TRAIN)
    assert sorted(clients_of(s.next_batch())) == ["small", "twin"]  # not for large
    call(s, "large", 3, rows=32, kind=TRAIN)
    assert clients_of(s.next_batch()) == ["large"]  # nor large for them
    call(s, "small", 1, rows=32, kind=TRAIN)
    assert s.next_batch() is None  # twin again
    call(s, "twin", 1, rows=32, kind=TRAIN)
    clock.advance(s.ready_in())  # their own wait, no convoy
    assert sorted(clients_of(s.next_batch())) == ["small", "twin"]
    for op in (Op.FORWARD, Op.BACKWARD):  # large now trains through 1 too
        call(s, "large", 1, rows=32, kind=TRAIN, op=op)
        assert s.ready_in() < BUDGETS.max_wait_s  # waiting for no one: theirs is no superset
        clock.advance(s.ready_in())
        assert clients_of(s.next_batch()) == ["large"]
    call(s, "small", 1, rows=32, kind=TRAIN)
    call(s, "twin", 1, rows=32, kind=TRAIN)
    assert s.next_batch() is None  # but small and twin wait for it now
    call(s, "large", 3, rows=32, kind=TRAIN)  # until it is queued elsewhere
    batches = sorted(sorted(clients_of(s.next_batch())) for _ in range(2))
    assert batches == [["large"], ["small", "twin"]]


def test_an_evaluations_forward_leaves_a_jobs_shape_as_it_was(clock) -> None:
    s = scheduler(Opportunistic(BUDGETS), clock)
    for name in ("a", "b"):
        train_through(s, clock, name, (1,))
    for layer in (0, 2):  # a evaluates: forward only, through layers its steps never call
        call(s, "a", layer, rows=32, kind=TRAIN)
        clock.advance(BUDGETS.max_wait_s)
        assert clients_of(s.next_batch()) == ["a"]
    call(s, "a", 1, rows=32, kind=TRAIN)  # its next step: still b's shape
    assert s.ready_in() == pytest.approx(BUDGETS.max_wait_s)  # b is coming: the convoy
    call(s, "b", 1, rows=32, kind=TRAIN)
    assert sorted(clients_of(s.next_batch())) == ["a", "b"]


def test_an_evaluations_call_waits_for_no_trainer_that_never_calls_there(clock) -> None:
    s = scheduler(Opportunistic(BUDGETS), clock)
    for name in ("a", "b"):
        train_through(s, clock, name, (1,))
    call(s, "a", 4, rows=1, kind=TRAIN)  # a's held-out prompt's greedy step, say: b never came
    assert s.ready_in() == pytest.approx(BUDGETS.training_wait_s, abs=2e-4)  # its own wait
    clock.advance(s.ready_in())
    assert clients_of(s.next_batch()) == ["a"]
    call(s, "b", 4, rows=1, kind=TRAIN)  # b evaluates there too now
    clock.advance(BUDGETS.max_wait_s)
    assert clients_of(s.next_batch()) == ["b"]
    call(s, "a", 4, rows=1, kind=TRAIN)
    assert s.ready_in() == pytest.approx(BUDGETS.max_wait_s)  # so b is waited for there


def test_an_evaluations_call_waits_for_no_trainer_that_evaluated_there_passes_ago(clock) -> None:
    s = scheduler(Opportunistic(BUDGETS), clock)
    for name in ("a", "b"):
        train_through(s, clock, name, (1,), head=3)
    for name in ("a", "b"):  # both evaluate at 4 (an epoch's validation, say)
        call(s, name, 4, rows=1, kind=TRAIN)
        clock.advance(BUDGETS.max_wait_s)
        assert clients_of(s.next_batch()) == [name]
    for _ in range(3):  # b trains on: its steps never call at 4
        train_through(s, clock, "b", (1,), head=3)
    call(s, "a", 4, rows=1, kind=TRAIN)  # a evaluates again: b is not coming there
    assert clients_of(s.next_batch()) == ["a"]  # nor expected next (after its head): at once


def test_a_jobs_last_short_batch_leaves_its_shape_passes_later(clock) -> None:
    s = scheduler(Opportunistic(BUDGETS), clock)
    for name in ("a", "b"):
        train_through(s, clock, name, (1,), head=3)
    train_through(s, clock, "a", (1, 2), head=3)  # its epoch's last batch trains through 2 too
    call(s, "a", 1, rows=32, kind=TRAIN)
    assert s.ready_in() < BUDGETS.max_wait_s  # b never trained through 2: not of its shape now
    clock.advance(s.ready_in())
    assert clients_of(s.next_batch()) == ["a"]
    for name in ("a", "b", "a", "b", "a"):
        train_through(s, clock, name, (1,), head=3)
    call(s, "a", 1, rows=32, kind=TRAIN)  # that batch is passes behind a: b's shape again
    assert s.ready_in() == pytest.approx(BUDGETS.max_wait_s)
    call(s, "b", 1, rows=32, kind=TRAIN)
    assert sorted(clients_of(s.next_batch())) == ["a", "b"]


def test_a_trainer_away_past_its_usual_gaps_is_not_waited_for(clock) -> None:
    s = scheduler(Opportunistic(BUDGETS), clock)
    for layer, gap in ((0, 0.0), (1, 0.002), (2, 0.002)):  # each back 2 ms after a reply
        clock.advance(gap)
        call(s, "a", layer, rows=32, kind=TRAIN)
        call(s, "b", layer, rows=32, kind=TRAIN)
        s.observe(s.next_batch(), 0.001)
    replied = clock.now
    assert max(PAUSE_S, AWAY_GAPS * 0.002) == PAUSE_S  # b pauses once 50 ms away, not 8
    clock.advance(0.010)  # b computes its own part; a is back (its next pass's layer 1)
    call(s, "a", 1, rows=32, kind=TRAIN)
    assert s.ready_in() == pytest.approx(BUDGETS.max_wait_s)  # b is coming: the convoy
    clock.advance(BUDGETS.max_wait_s)
    assert clients_of(s.next_batch()) == ["a"]  # the cap
    clock.advance(replied + PAUSE_S + 1e-4 - clock.now)  # b saves a checkpoint, say
    call(s, "a", 1, rows=32, kind=TRAIN)  # b is still active (0.5 s), but pausing
    assert s.ready_in() == pytest.approx(BUDGETS.training_wait_s, abs=2e-4)  # a's own wait
    call(s, "b", 1, rows=32, kind=TRAIN)  # b back in time for it
    assert sorted(clients_of(s.next_batch())) == ["a", "b"]


def test_a_trainer_queued_elsewhere_is_not_waited_for(clock) -> None:
    s = scheduler(Opportunistic(BUDGETS), clock)
    seen(s, {"a": TRAIN, "b": TRAIN})
    call(s, "a", 1, rows=32, kind=TRAIN)
    call(s, "b", 0, rows=32, kind=TRAIN)  # behind a: both settled, waiting would only stall
    assert clients_of(s.next_batch()) == ["b"]  # farthest behind first
    assert s.next_batch() is None  # b computes again: a waits for it at layer 1
    call(s, "b", 1, rows=32, kind=TRAIN)
    assert sorted(clients_of(s.next_batch())) == ["a", "b"]


def test_a_batch_of_enough_rows_waits_for_no_one(clock) -> None:
    s = scheduler(Opportunistic(BUDGETS), clock)
    for layer in (1, 0):  # b idle after layer 0: not known to lead to layer 1
        call(s, "b", layer, rows=32, kind=TRAIN)
        assert clients_of(s.next_batch()) == ["b"]
    call(s, "a", 1, rows=TRAINING_CONVOY_ROWS - 1, kind=TRAIN)
    assert s.next_batch() is None  # b is coming
    call(s, "a", 1, rows=1, kind=TRAIN)  # its products run near their best rate now
    assert clients_of(s.next_batch()) == ["a", "a"]


def test_the_wait_ends_at_the_cap(clock) -> None:
    s = scheduler(Opportunistic(BUDGETS), clock)
    seen(s, {"a": TRAIN, "b": TRAIN})
    call(s, "a", 1, rows=32, kind=TRAIN)
    clock.advance(BUDGETS.max_wait_s - 1e-4)
    assert s.next_batch() is None
    clock.advance(1e-4)
    assert clients_of(s.next_batch()) == ["a"]


def test_no_convoy_beside_inference_nor_under_the_eager_policy(clock) -> None:
    s = scheduler(Opportunistic(BUDGETS), clock)
    seen(s, {"a": TRAIN})
    call(s, "tenant", 0)  # idle after layer 0, where no call is known to lead to layer 1
    assert clients_of(s.next_batch()) == ["tenant"]
    call(s, "a", 1, rows=32, kind=TRAIN)
    assert clients_of(s.next_batch()) == ["a"]  # the tenant is no trainer
    s = scheduler(Opportunistic(BUDGETS), clock)
    for name, kind in (("tenant", INF), ("b", TRAIN)):  # both idle after layer 0
        call(s, name, 0, rows=32, kind=kind)
        assert clients_of(s.next_batch()) == [name]
    call(s, "a", 1, rows=32, kind=TRAIN)
    assert clients_of(s.next_batch()) == ["a"]  # beside an active tenant b holds it back no more
    s = scheduler(Eager(), clock)
    seen(s, {"a": TRAIN, "b": TRAIN})
    call(s, "a", 1, rows=32, kind=TRAIN)
    assert clients_of(s.next_batch()) == ["a"]


def test_a_trainer_that_said_goodbye_is_not_waited_for(clock) -> None:
    s = scheduler(Opportunistic(BUDGETS), clock)
    seen(s, {"a": TRAIN, "b": TRAIN})
    s.depart(b"b")  # its job ended: the trainer said goodbye
    call(s, "a", 1, rows=32, kind=TRAIN)
    assert clients_of(s.next_batch()) == ["a"]

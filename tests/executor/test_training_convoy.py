"""Training's convoy (`executor.readiness`): under the opportunistic policy a training batch
of fewer than `TRAINING_CONVOY_ROWS` rows waits, up to the policy's `convoy_s`, for every active
trainer that has no call queued (it computes its own part and comes back), so that concurrent
jobs share one batch per layer; never for an inference client, nor while one is active beside
the trainers, never past the cap, and never under the eager policy."""

from __future__ import annotations

import pytest

from executor.policy import Eager, Opportunistic
from executor.readiness import TRAINING_CONVOY_ROWS
from executor.scheduler import Scheduler
from tests.executor.queued import BUDGETS, INF, TRAIN, call, clients_of, scheduler


def seen(s: Scheduler, kinds: dict[str, object]) -> None:
    """Each client makes one call of its kind at layer 2 (so none is expected at layers 0-1),
    and the calls run."""
    for name, kind in kinds.items():
        call(s, name, 2, rows=32, kind=kind)
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
    call(s, "b", 0, rows=32, kind=TRAIN)  # b idle after layer 0: not known to lead to layer 1
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

"""Slices, driven by a fake clock: which batches run in slices (training beside inference,
a prefill beside other decoding tenants), and what runs between them (decode steps with their
convoy, then prefills, while training keeps its share of the compute time)."""

from __future__ import annotations

import threading
import time

import pytest

from executor.policy import Eager, Opportunistic
from executor.targets import SliceTuner
from tests.executor.queued import BUDGETS, TRAIN, call, clients_of, scheduler
from wire.call.messages import Op


def test_between_slices_decode_steps_keep_their_convoy(clock) -> None:
    s = scheduler(Opportunistic(BUDGETS), clock)
    for name in ("a", "b"):  # each has decoded at layer 2 before: a client is waited for where
        call(s, name, 2)  # it calls
    while s.next_batch():
        pass
    call(s, "trainer", 0, rows=256, kind=TRAIN)
    assert s.next_batch()[0].kind == TRAIN
    s.count_slice(0.001)  # its first slice ran
    call(s, "a", 2)
    call(s, "b", 1)  # behind a: a waits for it, between slices as anywhere
    assert clients_of(s.between_slices()) == ["b"]
    call(s, "b", 2)
    assert clients_of(s.between_slices()) == ["a", "b"]  # one batch for both
    call(s, "a", 3)
    assert s.between_slices() is None  # b, free now, may still join a
    clock.advance(BUDGETS.max_wait_s)  # it never comes: a waits no longer than the cap
    assert clients_of(s.between_slices()) == ["a"]


def test_training_batches_are_sliced_under_opportunistic_only(clock) -> None:
    s = scheduler(Opportunistic(BUDGETS, tuner=SliceTuner(0.001)), clock)
    rows = 200
    training = [call(s, "trainer", 0, rows=rows, kind=TRAIN, op=Op.BACKWARD)]
    assert s.slices(training) is None  # nobody decodes: slices would only cost throughput
    assert s.slices([call(s, "prefill", 1, rows=200)]) is None  # nobody else decodes
    assert s.slices(training) is None  # by the prior, 200 x 64 x 64 is one slice's work
    s.cost.observe((0, Op.BACKWARD), rows, 0.0045 + s.cost.overhead_s)  # measured: 4.5 ms
    assert s.slices(training) == 5  # an inference client is here: slices of the tuner's 1 ms
    assert s.slices([call(s, "small", 2, rows=1, kind=TRAIN)]) is None  # one slice anyway
    assert scheduler(Eager(), clock).slices(training) is None
    assert scheduler(Opportunistic(BUDGETS, tuner=None), clock).slices(training) is None


def test_a_prefill_is_sliced_only_beside_decoding_tenants(clock) -> None:
    s = scheduler(Opportunistic(BUDGETS, tuner=SliceTuner(0.001)), clock)
    prefill = [call(s, "prefill", 1, rows=200)]
    s.cost.observe((1, Op.FORWARD), 200, 0.0045 + s.cost.overhead_s)  # measured: 4.5 ms
    assert s.slices(prefill) is None  # nobody decodes: slices would only cost time
    call(s, "trainer", 0, rows=8, kind=TRAIN)
    assert s.slices(prefill) is None  # training does not cut a prefill
    decode = call(s, "decoder", 2)
    assert s.slices(prefill) == 5  # a decoding tenant: slices of the tuner's 1 ms
    assert s.slices([*prefill, decode]) is None  # a decode step is in the batch: whole
    shared = scheduler(Opportunistic(BUDGETS, tuner=SliceTuner(0.001)), clock)
    own = [call(shared, "worker", 1, rows=200)]
    shared.cost.observe((1, Op.FORWARD), 200, 0.0045 + shared.cost.overhead_s)
    call(shared, "worker", 2)  # a tenant of the same worker decodes: it waits for the prefill
    assert shared.slices(own) is None  # anyway, slices would not let it through sooner
    eager = scheduler(Eager(), clock)
    call(eager, "decoder", 2)
    assert eager.slices(prefill) is None


def test_decode_steps_then_prefills_run_between_slices_while_training_keeps_its_share(
        clock) -> None:
    s = scheduler(Opportunistic(BUDGETS), clock, training_share=0.25)
    call(s, "trainer", 0, rows=256, kind=TRAIN)
    assert s.next_batch()[0].kind == TRAIN  # the training batch starts
    s.count_slice(2.0)  # its first slice: 2 s of compute (a fake clock's seconds)
    decoders = [call(s, f"decoder-{i}", 1 + i % 2) for i in range(8)]
    prefill = call(s, "prefill", 1, rows=128)
    run = []
    while (batch := s.between_slices()) is not None:
        run.append(batch)
        s.observe(batch, 2.0)
    assert len(run) == 3  # one batch per layer, then the prefill: training at 2 s of 6 >= 25%
    assert sorted(c.client for b in run[:2] for c in b) == sorted(c.client for c in decoders)
    assert run[2] == [prefill]  # it waits behind no whole training batch
    assert (1, Op.FORWARD) not in s.queues or not s.queues[(1, Op.FORWARD)]
    s.count_slice(2.0)
    assert s.between_slices() is None  # nothing left
    interjected = 0
    while call(s, "decoder-0", 1) and (batch := s.between_slices()) is not None:
        s.observe(batch, 2.0)
        interjected += 1
    assert interjected == 4  # training had 4 s of 10: then 4/12 ... 4/16 >= 25%, 4/18 not
    assert len(s.queues[(1, Op.FORWARD)]) == 1  # the refused decode step waits
    s.count_slice(0.25)  # a short slice weighs less: 4.25 of 18.25 s
    assert s.between_slices() is None
    s.count_slice(2.0)  # 6.25 of 20.25
    assert s.between_slices() is not None


def test_only_decode_steps_run_between_a_prefills_slices_whatever_the_share(clock) -> None:
    s = scheduler(Opportunistic(BUDGETS), clock, training_share=0.25)
    for _ in range(8):  # the recent batches were all training: its share is full
        call(s, "trainer", 0, rows=256, kind=TRAIN)
        s.observe(s.next_batch(), 0.001)
    waiting = call(s, "other-prefill", 2, rows=128)
    decode = call(s, "decoder", 1)
    assert s.between_slices(training=False) == [decode]
    assert s.between_slices(training=False) is None  # a prefill never runs inside another
    assert s.between_slices(training=True) == [waiting]


def _train(s, batches: int) -> None:
    """`batches` training batches ran: training has had its share."""
    for _ in range(batches):
        call(s, "trainer", 2, rows=64, kind=TRAIN)
        s.observe(s.next_batch(), 0.001)


def _decode_every(s, clock, gap_s: float) -> None:
    """'decoder' walks layers 0 -> 1 three times, calling `gap_s` after each reply, then is
    served at layer 0: due at layer 1 until 2 x `gap_s` + 0.2 ms after."""
    for _ in range(3):
        for layer in (0, 1):
            batch = [call(s, "decoder", layer)]
            assert s.next_batch() == batch
            s.observe(batch, 0.001)
            clock.advance(gap_s)
    batch = [call(s, "decoder", 0)]
    assert s.next_batch() == batch
    s.observe(batch, 0.001)


def test_training_leaves_the_executor_to_a_decode_step_due_while_it_keeps_its_share(
        clock) -> None:
    s = scheduler(Opportunistic(BUDGETS), clock, training_share=0.25)
    _train(s, 8)
    _decode_every(s, clock, 0.002)  # run while training had nothing queued: not counted
    call(s, "trainer", 2, rows=64, kind=TRAIN)
    clock.advance(0.003)
    assert s.next_batch() is None  # the decoder is due at layer 1 for 1.2 ms more
    assert s.ready_in() == pytest.approx(0.0012)
    decode = call(s, "decoder", 1)
    assert s.next_batch() == [decode]
    s.observe([decode], 0.001)
    assert s.next_batch() is None  # next due at layer 0, the token after
    clock.advance(0.0043)  # it never came
    assert s.next_batch()[0].kind == TRAIN


def test_training_waits_for_no_decode_step_below_its_share_nor_under_eager(clock) -> None:
    s = scheduler(Opportunistic(BUDGETS), clock, training_share=0.25)
    _decode_every(s, clock, 0.002)  # training has not run yet: below its share
    call(s, "trainer", 2, rows=64, kind=TRAIN)
    assert s.next_batch()[0].kind == TRAIN
    eager = scheduler(Eager(), clock)
    _train(eager, 8)
    _decode_every(eager, clock, 0.002)
    call(eager, "trainer", 2, rows=64, kind=TRAIN)
    assert eager.next_batch()[0].kind == TRAIN


def test_between_slices_training_waits_for_a_due_decode_step_no_longer_than_it_is_due(
        clock) -> None:
    s = scheduler(Opportunistic(BUDGETS), clock, training_share=0.25)
    assert s.hold_training() is False  # nobody decodes
    _train(s, 8)
    _decode_every(s, clock, 0.002)
    started = time.monotonic()
    assert s.hold_training() is True  # up to 4.2 ms (the fake clock stands still meanwhile)
    assert time.monotonic() - started >= 0.0035
    clock.advance(0.0043)
    assert s.hold_training() is False  # no longer due
    assert s.between_slices() is None


def test_a_queued_decode_step_wakes_a_held_training_batch(clock) -> None:
    s = scheduler(Opportunistic(BUDGETS), clock)
    waiting, woke = threading.Event(), []

    def hold() -> None:
        with s.decode_came:
            waiting.set()
            woke.append(s.decode_came.wait(30))

    thread = threading.Thread(target=hold)
    thread.start()
    waiting.wait(30)
    call(s, "decoder", 1)  # queued once `hold` waits (it holds the lock until then)
    thread.join(30)
    assert woke == [True]

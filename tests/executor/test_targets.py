"""Latency targets per lane, and the training slice sized to keep the decode target: it shrinks
while decode steps miss the target behind training, grows back when they have room."""

from __future__ import annotations

import pytest
import torch

from executor.calls import PendingCall
from executor.lanes import Lane
from executor.policy import Budgets, Opportunistic
from executor.scheduler import Scheduler
from executor.targets import MISS_SHARE, LatencyTargets, SliceTuner
from wire.call.messages import Call, CallKind, Op


def test_targets_are_per_lane_and_training_and_flex_have_none() -> None:
    targets = LatencyTargets(decode_s=0.002, prefill_s=0.03)
    assert [targets.of(lane) for lane in Lane] == [0.002, 0.03, None, None]


def test_the_slice_shrinks_while_decode_steps_miss_and_grows_back_to_the_target() -> None:
    tuner = SliceTuner(target_s=0.004, window=100)
    assert tuner.slice_s == 0.004  # it starts at the target
    allowed = int(MISS_SHARE * 100)
    for i in range(100):  # as many misses as a window allows: no change
        tuner.observe(0.005 if i < allowed else 0.003)
    assert tuner.slice_s == 0.004
    for i in range(100):  # one more: it shrinks
        tuner.observe(0.005 if i <= allowed else 0.003)
    assert tuner.slice_s == 0.004 * 0.7
    for _ in range(30):
        for _ in range(100):
            tuner.observe(0.01)
    assert tuner.slice_s == tuner.floor_s == 0.0005  # never below the floor
    for _ in range(30):
        for _ in range(100):
            tuner.observe(0.001)  # well within half the target: room to grow
    assert tuner.slice_s == 0.004  # back to the target, never above it
    for _ in range(100):
        tuner.observe(0.0025)  # within the target but not within half: it holds
    assert tuner.slice_s == 0.004


def _call(client: bytes, rows: int, kind: CallKind, arrived: float) -> PendingCall:
    return PendingCall(client, Call(0, Op.FORWARD, 0, kind, "float32", (rows, 8)),
                       torch.empty(rows, 8), arrived)


def test_the_scheduler_feeds_the_tuner_the_waits_of_decode_steps_queued_behind_training(
        ) -> None:
    now = [0.0]
    tuner = SliceTuner(target_s=0.004, window=4)
    scheduler = Scheduler(Opportunistic(Budgets(), tuner=tuner), clock=lambda: now[0])
    late = [_call(b"d", 1, CallKind.INFERENCE, 0.99) for _ in range(4)]
    scheduler.observe_waits(late, started=1.01)  # no training ran: not the slices' doing
    assert tuner.slice_s == 0.004
    scheduler.add(_call(b"t", 256, CallKind.TRAINING, 0.0))
    training = scheduler.next_batch()
    now[0] = 1.0
    scheduler.observe(training, 0.004)  # it ended after the decode steps were queued
    scheduler.observe_waits(late, started=1.01)  # 20 ms, behind training: too long
    assert tuner.slice_s == scheduler.training_slice_s() == 0.004 * 0.7
    after = [_call(b"d", 1, CallKind.INFERENCE, 1.005) for _ in range(4)]
    scheduler.observe_waits(after, started=1.05)  # queued after training ended: not fed
    assert tuner.slice_s == 0.004 * 0.7
    now[0] = 1.1
    scheduler.slice_ran()  # a slice of a longer training batch (or a prefill) ended
    scheduler.observe_waits(after, started=1.11)
    assert tuner.slice_s == 0.004 * 0.7 * 0.7
    assert Scheduler(Opportunistic(Budgets(), tuner=None)).training_slice_s() is None


def test_the_slice_follows_the_tightest_target_its_tenants_ask_for() -> None:
    tuner = SliceTuner(target_s=0.004, window=10)
    for _ in range(10):  # 1.5 ms waits: within the executor's target, over a tenant's 1 ms
        tuner.observe(0.0015, 0.001)
    assert tuner.slice_s == 0.004 * 0.7  # they missed their own target: it shrinks
    for _ in range(10):
        tuner.observe(0.0003, 0.001)  # room within half of 1 ms: it grows, up to 1 ms only
    assert tuner.slice_s == 0.001
    for _ in range(10):
        tuner.observe(0.0003)  # a window of only the executor's target: it grows past it again
    assert tuner.slice_s == 0.00125
    for _ in range(10):
        tuner.observe(0.00001, 0.0001)  # a 0.1 ms target cannot take it below the floor
    assert tuner.slice_s == tuner.floor_s == 0.0005
    for _ in range(10):
        tuner.observe(0.0003, 0.01)  # a looser one than the executor's: capped by its own
    assert tuner.slice_s == 0.0005 * 1.25
    for _ in range(40):
        for _ in range(10):
            tuner.observe(0.0003, 0.01)
    assert tuner.slice_s == 0.004


def test_a_call_carries_its_own_target_for_its_lane() -> None:
    def target(rows: int, kind: CallKind, decode_us: int, prefill_us: int,
               decode: bool = False) -> float | None:
        return PendingCall(b"c", Call(0, Op.FORWARD, 0, kind, "float32", (rows, 8),
                                      decode_target_us=decode_us, prefill_target_us=prefill_us,
                                      decode=decode), torch.empty(rows, 8), 0.0).target_s

    assert target(1, CallKind.INFERENCE, 250, 40_000) == pytest.approx(0.00025)
    assert target(64, CallKind.INFERENCE, 250, 40_000) == pytest.approx(0.04)
    # a decode step of 64 rows (or rows with prompts' chunks packed) waits as its rows allow
    assert target(64, CallKind.INFERENCE, 250, 40_000, decode=True) == pytest.approx(0.00025)
    assert target(1, CallKind.INFERENCE, 0, 40_000) is None  # the executor's own
    assert target(1, CallKind.TRAINING, 250, 40_000) is None  # training has none

"""Executor metrics by kind and by lane, as typed figures."""

from __future__ import annotations

import pytest
import torch

from executor.calls import PendingCall
from executor.lanes import Lane, lane_of, lane_of_batch
from executor.stats import ExecutorStats
from executor.targets import LatencyTargets
from wire.call.messages import Call, CallKind, Op
from wire.figures import LaneFigures


def pending(rows: int, kind: CallKind, arrived: float, decode: bool = False) -> PendingCall:
    return PendingCall(b"c", Call(0, Op.FORWARD, 0, kind, "float32", (rows, 8), decode=decode),
                       torch.empty(rows, 8), arrived)


def test_lanes_follow_kind_and_size() -> None:
    decode = pending(1, CallKind.INFERENCE, 0.0)
    prefill = pending(128, CallKind.INFERENCE, 0.0)
    small_training = pending(4, CallKind.TRAINING, 0.0)
    assert [lane_of(c) for c in (decode, prefill, small_training)] == \
        [Lane.DECODE, Lane.PREFILL, Lane.TRAINING]
    assert lane_of_batch([small_training, prefill]) == Lane.PREFILL
    assert lane_of_batch([prefill, decode]) == Lane.DECODE


def test_a_call_marked_a_decode_step_is_one_whatever_its_rows() -> None:
    packed = pending(4 + 252, CallKind.INFERENCE, 0.0, decode=True)  # rows + a chunk's tokens
    wide = pending(64, CallKind.INFERENCE, 0.0, decode=True)  # a batch of 64 rows
    assert [lane_of(c) for c in (packed, wide)] == [Lane.DECODE, Lane.DECODE]
    assert lane_of(pending(4, CallKind.TRAINING, 0.0, decode=True)) == Lane.TRAINING


def test_waits_and_compute_are_counted_per_lane() -> None:
    stats = ExecutorStats()
    stats.record_batch([pending(1, CallKind.INFERENCE, 9.0), pending(2, CallKind.INFERENCE, 9.5),
                        pending(256, CallKind.TRAINING, 8.0)], started=10.0, compute_s=0.25)
    stats.record_batch([pending(128, CallKind.INFERENCE, 10.0)], started=10.5, compute_s=0.5)
    figures = stats.snapshot()
    lanes = figures.lanes
    assert lanes["decode"] == LaneFigures(calls=2, batches=1, compute_s=0.25, wait_s=1.5,
                                          mean_wait_ms=750.0, target_ms=1.0, met=0)
    assert lanes["prefill"].calls == 1 and lanes["prefill"].compute_s == 0.5
    assert lanes["prefill"].wait_s == pytest.approx(0.5)
    assert lanes["training"] == LaneFigures(calls=1, batches=0, compute_s=0.0, wait_s=2.0,
                                            mean_wait_ms=2000.0)  # no target, none met
    assert figures.mixed_batches == 1


def test_each_lane_counts_the_calls_that_met_its_target() -> None:
    stats = ExecutorStats(LatencyTargets(decode_s=0.6, prefill_s=0.1), lambda: 0.004)
    stats.record_batch([pending(1, CallKind.INFERENCE, 9.0), pending(2, CallKind.INFERENCE, 9.5),
                        pending(256, CallKind.TRAINING, 8.0)], started=10.0, compute_s=0.25)
    stats.record_batch([pending(128, CallKind.INFERENCE, 10.45)], started=10.5, compute_s=0.5)
    figures = stats.snapshot()
    decode, prefill = figures.lanes["decode"], figures.lanes["prefill"]
    assert (decode.target_ms, decode.met, decode.calls) == (600.0, 1, 2)  # 0.5 s met, 1.0 not
    assert (prefill.target_ms, prefill.met) == (100.0, 1)  # waited 0.05 s
    assert figures.lanes["training"].target_ms is None and figures.lanes["training"].met == 0
    assert figures.training_slice_ms == 4.0
    assert (figures.training_share, figures.training_share_floor) == (0.0, 0.0)  # none given
    assert (figures.training_holds, figures.training_held_s) == (0, 0.0)
    stats.record_hold(0.002)
    stats.record_hold(0.001)
    figures = stats.snapshot()
    assert figures.training_holds == 2 and figures.training_held_s == pytest.approx(0.003)


def test_a_call_is_counted_against_the_target_its_tenants_asked_for() -> None:
    def asking(rows: int, arrived: float, decode_us: int, prefill_us: int) -> PendingCall:
        return PendingCall(b"c", Call(0, Op.FORWARD, 0, CallKind.INFERENCE, "float32", (rows, 8),
                                      decode_target_us=decode_us, prefill_target_us=prefill_us),
                           torch.empty(rows, 8), arrived)

    stats = ExecutorStats(LatencyTargets(decode_s=0.001, prefill_s=0.05))
    # each waits 2 ms: over the executor's decode target, within these tenants' own
    stats.record_batch([asking(1, 9.998, 3000, 0)], started=10.0, compute_s=0.001)
    stats.record_batch([asking(1, 9.998, 0, 0), asking(2, 9.998, 2500, 1)], started=10.0,
                       compute_s=0.001)
    # 30 ms: within the executor's prefill target, over this tenant's 20 ms; the decode
    # target it also carries is not a prefill's
    stats.record_batch([asking(128, 9.97, 1, 20_000)], started=10.0, compute_s=0.01)
    stats.record_batch([asking(128, 9.97, 1, 0)], started=10.0, compute_s=0.01)
    lanes = stats.snapshot().lanes
    assert (lanes["decode"].calls, lanes["decode"].met) == (3, 2)
    assert (lanes["prefill"].calls, lanes["prefill"].met) == (2, 1)
    assert lanes["decode"].target_ms == 1.0  # the executor's own, as before

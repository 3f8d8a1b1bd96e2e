"""Lanes: what a call is for, read off its kind and size (decode step, prefill, training).

A decode step (an inference call of a few rows) is one of a token's ~50 calls, so its wait adds
straight to the token's latency; a prefill's wait adds to time-to-first-token but is small next to
its own compute; a training call only needs throughput. The opportunistic policy runs decode steps
first among ready queues, and the metrics report waits and compute time per lane.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import IntEnum

from executor.calls import PendingCall
from wire.executor import CallKind

DECODE_ROWS = 32  # an inference call of at most this many rows is a decode step


class Lane(IntEnum):
    DECODE = 0
    PREFILL = 1
    TRAINING = 2


def lane_of(call: PendingCall) -> Lane:
    if call.kind == CallKind.TRAINING:
        return Lane.TRAINING
    return Lane.DECODE if call.rows <= DECODE_ROWS else Lane.PREFILL


def lane_of_batch(calls: Iterable[PendingCall]) -> Lane:
    """The most urgent lane among the calls (a queue or batch holds calls of several lanes)."""
    return min(lane_of(c) for c in calls)

"""Lanes: what a call is for, read off its kind, its worker's marks and its size (decode step,
prefill, training; flex: an inference call of flex requests' rows only, which runs after every
other inference call and is no decode client's company to wait for).

A decode step (an inference call its worker marks so, or one of a few rows) is one of a token's
~50 calls, so its wait adds straight to the token's latency; a prefill's wait adds to
time-to-first-token but is small next to its own compute; a training call only needs throughput.
The opportunistic policy runs decode steps first among ready queues, and the metrics report waits
and compute time per lane. A call's lane is computed once, when it arrives (`PendingCall.lane`).
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import IntEnum

from executor.calls import DECODE_ROWS, PendingCall

__all__ = ["DECODE_ROWS", "Lane", "lane_of", "lane_of_batch"]


class Lane(IntEnum):
    DECODE = 0
    PREFILL = 1
    TRAINING = 2
    FLEX = 3


def lane_of(call: PendingCall) -> Lane:
    return Lane(call.lane)


def lane_of_batch(calls: Iterable[PendingCall]) -> Lane:
    """The most urgent lane among the calls (a queue or batch holds calls of several lanes)."""
    return Lane(min(c.lane for c in calls))

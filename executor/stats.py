"""Executor metrics by call kind: batch sizes, waits, compute time, queue depth, rows/s; and by
lane (decode steps, prefills, training: `executor.lanes`): calls, waits and compute time.

A snapshot is typed data (`wire.figures`), the answer to a stats request on the executor's
socket; the gateway renders it for Prometheus. Written by the compute loop, read by the IO
thread, guarded by one lock.
"""

from __future__ import annotations

import bisect
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from executor.calls import PendingCall
from executor.lanes import Lane
from executor.share import ShareNow
from executor.targets import LatencyTargets
from wire.call.messages import CallKind
from wire.figures import ExecutorFigures, HistogramFigures, KindFigures, LaneFigures

BATCH_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 32, 64)
WAIT_BUCKETS_MS = (0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 50, 100)


@dataclass
class Histogram:
    bounds: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    n: int = 0

    def __post_init__(self) -> None:
        self.counts = [0] * (len(self.bounds) + 1)

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.total += value
        self.n += 1

    def mean(self) -> float:
        return self.total / self.n if self.n else 0.0

    def figures(self) -> HistogramFigures:
        return HistogramFigures(list(self.bounds), list(self.counts), self.total, self.n)


@dataclass
class KindStats:
    calls: int = 0
    rows: int = 0
    batches: int = 0  # batches that contained at least one call of this kind
    compute_s: float = 0.0
    batch_calls: Histogram = field(default_factory=lambda: Histogram(BATCH_BUCKETS))
    wait_ms: Histogram = field(default_factory=lambda: Histogram(WAIT_BUCKETS_MS))


@dataclass
class LaneStats:
    calls: int = 0
    batches: int = 0  # batches whose most urgent call is in this lane
    compute_s: float = 0.0  # of those batches
    wait_s: float = 0.0  # summed over this lane's calls
    target_s: float | None = None  # the executor's own; a call may carry its tenants'
    met: int = 0  # calls that waited no longer than their target

    def waited(self, seconds: float, own_target_s: float | None = None) -> None:
        self.calls += 1
        self.wait_s += seconds
        target = self.target_s if own_target_s is None else own_target_s
        if target is not None and seconds <= target:
            self.met += 1


class ExecutorStats:
    def __init__(self, targets: LatencyTargets | None = None,
                 training_slice_s: Callable[[], float | None] = lambda: None, *,
                 training_share: Callable[[], ShareNow] = lambda: ShareNow(0.0, 0.0),
                 head_loss: bool = False) -> None:
        self.lock = threading.Lock()
        self.head_loss = head_loss
        self.started = time.monotonic()
        self.kinds = {kind: KindStats() for kind in CallKind}
        targets = targets or LatencyTargets()
        self.lanes = {lane: LaneStats(target_s=targets.of(lane)) for lane in Lane}
        self.training_slice_s = training_slice_s
        self.training_share = training_share
        self.mixed_batches = 0  # batches with both inference and training calls
        self.training_holds = 0  # a training batch waited between slices for a decode step
        self.training_held_s = 0.0
        self.errors = 0
        self.queue_depth = 0
        self.clients = 0

    def record_batch(self, batch: list[PendingCall], started: float, compute_s: float) -> None:
        with self.lock:
            first = batch[0]
            if len(batch) == 1:  # the common case, one call: no sets, no loops
                stats = self.kinds[first.kind]
                stats.batches += 1
                stats.batch_calls.observe(1)
                stats.compute_s += compute_s
                stats.calls += 1
                stats.rows += first.rows
                wait = started - first.arrived
                stats.wait_ms.observe(wait * 1e3)
                lane = self.lanes[first.lane]
                lane.batches += 1
                lane.compute_s += compute_s
                lane.waited(wait, first.target_s)
                return
            kinds = {call.kind for call in batch}
            if len(kinds) > 1:
                self.mixed_batches += 1
            for kind in kinds:
                stats = self.kinds[kind]
                stats.batches += 1
                stats.batch_calls.observe(len(batch))
                stats.compute_s += compute_s
            lane = self.lanes[min(c.lane for c in batch)]
            lane.batches += 1
            lane.compute_s += compute_s
            for call in batch:
                stats = self.kinds[call.kind]
                stats.calls += 1
                stats.rows += call.rows
                stats.wait_ms.observe((started - call.arrived) * 1e3)
                self.lanes[call.lane].waited(started - call.arrived, call.target_s)

    def record_hold(self, seconds: float) -> None:
        with self.lock:
            self.training_holds += 1
            self.training_held_s += seconds

    def record_error(self) -> None:
        with self.lock:
            self.errors += 1

    def snapshot(self) -> ExecutorFigures:
        with self.lock:
            uptime = time.monotonic() - self.started
            kinds = {
                kind.name.lower(): KindFigures(
                    calls=s.calls, rows=s.rows, batches=s.batches, compute_s=s.compute_s,
                    mean_batch_calls=s.batch_calls.mean(), mean_wait_ms=s.wait_ms.mean(),
                    rows_per_s=s.rows / uptime if uptime else 0.0,
                    batch_calls=s.batch_calls.figures(), wait_ms=s.wait_ms.figures())
                for kind, s in self.kinds.items()
            }
            lanes = {lane.name.lower(): LaneFigures(
                calls=s.calls, batches=s.batches, compute_s=s.compute_s, wait_s=s.wait_s,
                mean_wait_ms=1e3 * s.wait_s / s.calls if s.calls else 0.0,
                target_ms=None if s.target_s is None else 1e3 * s.target_s, met=s.met)
                for lane, s in self.lanes.items()}
            slice_s = self.training_slice_s()
            share = self.training_share()
            hold_s = share.twin_hold_s
            return ExecutorFigures(uptime_s=uptime, queue_depth=self.queue_depth,
                                   clients=self.clients, mixed_batches=self.mixed_batches,
                                   errors=self.errors, kinds=kinds, lanes=lanes,
                                   training_slice_ms=None if slice_s is None else 1e3 * slice_s,
                                   training_holds=self.training_holds,
                                   training_held_s=self.training_held_s,
                                   training_share=share.share,
                                   training_share_floor=share.floor,
                                   twin_hold_ms=None if hold_s is None else 1e3 * hold_s,
                                   twin_owed_batches=share.twin_owed,
                                   head_loss=self.head_loss)

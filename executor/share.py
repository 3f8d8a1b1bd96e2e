"""Training's share of the executor's compute time: what inference must leave it.

Training keeps at least `floor` of the compute time of the batches that ran while it had work (a
call queued, or a sliced batch of its running), over the last `WINDOW` such batches; each slice
of a training batch counts as a batch of its own seconds. Counted by batches instead, its 0.5 ms
slices weighed as much as the ~4 ms decode batches between them, and beside 6 decoding tenants
training held its floor of batches with ~10 % of the executor's time (bench NOTES). Batches that
ran while training had nothing queued (its trainers computing their own part of a step, or no
job at all) count for neither side: training builds no debt then, so it never takes a burst of
the executor back from decoding tenants. The window is long, so what training ran while
inference was idle (between requests) is credit: while its share stays above the floor, a
training batch leaves the executor to decode steps about to come (`Scheduler.hold_training`)
instead of slicing into a token (a 64-batch window held at most 48 decode batches of credit, ~4
tokens of llama-160m; Azure trace + 2 jobs, 2 cores, bench NOTES). With an idle twin
(`executor.twin`) the jobs' calls go there: the serving executor counts the twin's compute seconds
as training's and its queued or running calls as training's work (`executor.twin_ledger`), and
while training is owed its floor, its inference batches leave the host to the twin a moment;
while it is not, each inference batch holds the twin's training up to `TWIN_HOLD_S`, in
proportion to training's margin over its floor (at nice 19 the twin left the tenants the cores
but not the memory bandwidth: on the Azure trace + 2 jobs the tenants' per-token latency was
1.24-1.35x of the trace alone without the hold, 1.16x with a fixed 10 ms, 0.96x with this one;
bench NOTES).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import NamedTuple

from executor.twin_ledger import TwinLedger

WINDOW = 1024
TWIN_HOLD_S = 0.05  # the longest an inference batch keeps the idle twin's training from the host


class ShareNow(NamedTuple):
    """Training's recent share of the compute time and its floor; with an idle twin, how long
    an inference batch now holds the twin's training, and the inference batches that began while
    the twin was owed its floor (each left it the host a turn first, unless starving)."""
    share: float
    floor: float
    twin_hold_s: float | None = None
    twin_owed: int = 0


class TrainingShare:
    """`twin`: the serving executor's view of its idle twin (whose work and compute seconds are
    training's); `tell`: the twin's own, where it tells them."""

    def __init__(self, floor: float, window: int = WINDOW, *, twin: TwinLedger | None = None,
                 tell: TwinLedger | None = None, threads: int = 1,
                 cpu: Callable[[], float] = time.process_time) -> None:
        self.floor = floor
        self.twin, self.tell = twin, tell
        self.threads = threads  # the twin's compute threads: its CPU seconds per second of work
        self.cpu = cpu  # the twin's CPU time, all its threads'
        self._cpu_started = 0.0  # the twin's CPU time as its running batch started
        self._queued = 0  # training calls queued now
        self._running = False  # a training batch runs now (in slices, with batches between)
        self._recent: deque[tuple[bool, float]] = deque(maxlen=window)  # counted batches
        self._training_s = 0.0  # the compute seconds of those that were training's
        self._counted_s = 0.0
        self._sliced_s = 0.0  # the running training batch's slices so far, counted
        self._twin_s = 0.0  # the twin's compute seconds counted so far
        self.owed_batches = 0  # inference batches begun while the twin was owed its floor

    @property
    def queued(self) -> int:
        return self._queued

    @queued.setter
    def queued(self, calls: int) -> None:
        self._queued = calls
        self._told()

    @property
    def running(self) -> bool:
        return self._running

    @running.setter
    def running(self, running: bool) -> None:
        self._running = running
        self._told()

    def start(self, training: bool) -> None:
        """A batch starts (not one run between slices): a training one runs until `ran`."""
        self.running, self._sliced_s = training, 0.0
        if self.tell is not None:
            self._cpu_started = self.cpu()

    def sliced(self, seconds: float) -> None:
        """A slice of the running training batch computed for `seconds`."""
        self.record(True, seconds)
        self._sliced_s += seconds

    def ran(self, training: bool, seconds: float) -> None:
        """A batch computed for `seconds` in all (a training batch's slices counted already)."""
        if not training:
            self.record(False, seconds)
            return
        self.record(True, max(seconds - self._sliced_s, 0.0))
        self.running, self._sliced_s = False, 0.0

    def record(self, training: bool, seconds: float) -> None:
        """A batch (or a slice of one) computed for `seconds`; a non-training one counts
        while training has work: a call queued, or a batch of its running in slices (here or
        on the twin)."""
        if training and self.tell is not None:
            self.tell.computed(self._got(seconds))
        self._pull()
        if training or self.running or self.queued or self.on_twin():
            self._append(training, seconds)

    def on_twin(self) -> bool:
        """Whether the idle twin has training calls queued or running."""
        return self.twin is not None and self.twin.calls > 0

    def owed(self, share: float | None = None) -> bool:
        """Whether the twin's training, which has work, is below its floor (`share`: its
        recent share, if read already): the serving executor then leaves it the host a moment,
        and no longer holds it."""
        owed = self.on_twin() and (self.of_recent() if share is None else share) < self.floor
        if owed:
            self.twin.hold(0.0)
        return owed

    def inference_started(self, now: float) -> None:
        """An inference batch starts: the twin's training leaves the host a moment (unless
        training is owed its floor); the share read once for both."""
        if self.twin is None:
            return
        share = self.of_recent()
        if self.owed(share):
            self.owed_batches += 1
        else:
            self.twin.hold(now + self.hold_at(share))

    def now(self) -> ShareNow:
        share = self.of_recent()
        hold_s = self.hold_at(share) if self.twin is not None else None
        return ShareNow(share, self.floor, hold_s, self.owed_batches)

    def hold_at(self, share: float) -> float:
        """How long an inference batch holds the twin's training at training's recent `share`:
        `TWIN_HOLD_S` while training keeps twice its floor, less as its share nears the floor,
        none at it (held long beside continuous decode, the twin fell below its floor, and the
        floor's turns then cost every call up to the starvation bound; bench NOTES)."""
        margin = (share - self.floor) / self.floor
        return TWIN_HOLD_S * min(max(margin, 0.0), 1.0)

    def held(self, now: float) -> float:
        """Seconds the twin's training should still leave the host to inference."""
        return max(self.tell.held_until - now, 0.0) if self.tell is not None else 0.0

    def _pull(self) -> None:
        """Count what the twin computed since the last look, as training's."""
        if self.twin is not None and (seconds := self.twin.seconds) > self._twin_s:
            self._append(True, seconds - self._twin_s)
            self._twin_s = seconds

    def _got(self, seconds: float) -> float:
        """What of a batch's `seconds` the twin had the host for: its CPU time over its threads,
        at most the seconds themselves (at nice 19, others' compute stretches its batches)."""
        now = self.cpu()
        cpu, self._cpu_started = now - self._cpu_started, now
        return min(seconds, cpu / self.threads)

    def _told(self) -> None:
        if self.tell is not None:
            self.tell.working(self._queued + self._running)

    def _append(self, training: bool, seconds: float) -> None:
        if len(self._recent) == self._recent.maxlen:
            was_training, was_s = self._recent[0]
            self._counted_s -= was_s
            self._training_s -= was_s if was_training else 0.0
        self._recent.append((training, seconds))
        self._counted_s += seconds
        self._training_s += seconds if training else 0.0

    def of_recent(self) -> float:
        """Training's share of the counted batches' compute time."""
        self._pull()
        if self._counted_s <= 0 or not self._recent:
            return 0.0
        return min(max(self._training_s / self._counted_s, 0.0), 1.0)

    def kept(self) -> bool:
        """Whether training has at least its floor of the recent batches' compute time."""
        return self.of_recent() >= self.floor

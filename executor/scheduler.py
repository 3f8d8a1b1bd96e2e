"""Per-layer queues of pending calls and the choice of what runs next.

Bookkeeping only, no tensors. Thread-safe: calls are added by whichever executor thread drains the
socket; batches are taken by whichever holds the compute slot. Besides the queues, it tracks each
client's presence (`executor.presence`); an opportunistic batch waits only while a client may still
join it. Decode steps travel as a convoy (opportunistic): a decode step waits, up to the policy's
`convoy_s`, while a decode client is queued earlier in the pass (served first, it comes here next)
or an idle one is due here (within twice its usual gap from a reply to this layer). Each batch then
carries every decoding tenant: on a skinny matmul one weight read serves 8 rows for about the cost
of 4 (llama-160m, 8 tenants, 2 cores: 3.9 -> 7.7 calls per batch, 42 -> 54 tokens/s). Choosing among
ready queues: any call waiting past `starvation_s` goes first; then inference before training, but
training keeps at least `training_share` of the compute time while it has work (`executor.share`);
then the policy's order (first come first served; or for opportunistic batching decode steps first,
then the queue farthest behind in the model: a layer's position in forward order, reversed for
backward). Decode steps, prefills and training calls for one layer share its queue, so they can
share a batch (one matmul for every tenant). A training batch, and a prefill beside decoding
tenants, may run in slices (`slices`, as the policy says, sized by the waits of decode steps queued
behind a slice: `observe_waits`). Between a training batch's slices the ready decode steps run, then
the ready prefills, as long as training keeps `training_share` of the compute time, each slice its
own; between a prefill's slices, the ready decode steps (`between_slices`). While training has more
than its share, a training batch, before it starts and between its slices, leaves the executor idle
for a decode step about to come (queued for its convoy, or due: `hold_training`), so a token's calls
do not each wait for a slice begun in the gap before them. Within a batch that exceeds
`max_batch_rows`, clients are taken round-robin, so a client flooding one layer cannot crowd others
out. Flex requests' calls (`Lane.FLEX`: a worker's steps of flex requests only) wait, up to
starving, while a decode step is about to come, and run after every other inference call.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterator

from executor.calls import DECODE_ROWS, PendingCall, take
from executor.lanes import Lane, lane_of_batch
from executor.policy import CostModel, Eager, Policy
from executor.presence import Key, Presence, forget_departed
from executor.readiness import held_waits, queue_waits, training_holds
from executor.share import ShareNow, TrainingShare
from executor.targets import LatencyTargets
from wire.call.messages import CallKind, Op

TWIN_TURN_S = 0.002  # how long inference leaves the host to an owed twin before looking again


class Scheduler:
    def __init__(self, policy: Policy | None = None, *, max_batch_rows: int = 8192,
                 training_share: float = 0.25, active_window_s: float = 0.5,
                 starvation_s: float = 0.2, widths: dict[int, int] | None = None,
                 positions: dict[int, int] | None = None,
                 targets: LatencyTargets | None = None, share: TrainingShare | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.policy = policy or Eager()
        self.targets = targets or LatencyTargets()
        self.max_batch_rows = max_batch_rows
        self.active_window_s = active_window_s
        self.starvation_s = starvation_s
        self.widths = widths or {}
        self.positions = positions or {}  # layer index -> position in forward order
        self.clock = clock
        self.cost = CostModel()
        self.lock = threading.Lock()
        self.decode_came = threading.Condition(self.lock)  # notified as a decode step is queued
        self.queues: dict[Key, deque[PendingCall]] = {}
        self.busy: dict[Key, deque[PendingCall]] = {}  # the non-empty queues, oldest first
        self.presence: dict[bytes, Presence] = {}
        self.successor: dict[Key, Key] = {}
        self.share = share or TrainingShare(training_share)  # `share`: one with an idle twin
        # when the last training batch, or slice of one or of a prefill, ended: decode steps
        # queued before then waited behind it
        self._long_done = float("-inf")
        self._seq = 0
        self._next_forget = 0.0

    def training_share_now(self) -> ShareNow:
        """Training's share of the recent compute time while it had work, its floor, and the
        idle twin's hold."""
        with self.lock:
            return self.share.now()

    # -- called by the IO side -------------------------------------------------------------------

    def add(self, call: PendingCall) -> None:
        with self.lock:
            self._seq += 1
            call.seq = self._seq
            estimate = self.cost.estimate(call.key, call.rows, self.widths.get(call.layer, 0))
            call.deadline = self.policy.deadline(call, estimate)
            if call.target_s is not None:  # no company is worth a wait its tenants did not allow
                call.deadline = min(call.deadline, call.arrived + call.target_s)
            queue = self.queues.get(call.key)
            if queue is None:
                queue = self.queues[call.key] = deque()
            queue.append(call)
            self.busy[call.key] = queue
            me = self.presence.get(call.client)
            if me is None:
                me = self.presence[call.client] = Presence(call.arrived)
            me.arrive(call, self.successor)
            if call.lane == Lane.DECODE:
                self.decode_came.notify_all()
            elif call.kind == CallKind.TRAINING:
                self.share.queued += 1

    # -- called by the compute side --------------------------------------------------------------

    def next_batch(self) -> list[PendingCall] | None:
        """Pop the batch to run now, if any."""
        with self.lock:
            if not self.busy:
                return None
            now = self.clock()
            ready = [q for q, wait in self._scan(now) if wait <= 0]
            if not ready:
                return None
            queue = ready[0] if len(ready) == 1 else self._choose(ready, now)
            batch = take(queue, self.max_batch_rows)
            if not queue:
                del self.busy[batch[0].key]
            trained = 0
            for call in batch:
                self.presence[call.client].queued -= 1
                trained += call.kind == CallKind.TRAINING
            self.share.queued -= trained
            self.share.start(trained == len(batch))
            if trained < len(batch):
                self.share.inference_started(now)
            return batch

    def observe_waits(self, batch: list[PendingCall], started: float) -> None:
        """The waits of decode steps that were queued while a training batch or a slice ran
        size the next slices; other waits are not the slices' doing."""
        tuner = getattr(self.policy, "tuner", None)
        if tuner is None:
            return
        for call in batch:
            if call.lane == Lane.DECODE and call.arrived < self._long_done:
                tuner.observe(started - call.arrived, call.target_s)

    def slice_ran(self) -> None:
        """A slice of a training batch or a prefill just ended (the batch goes on after what
        `between_slices` gives)."""
        with self.lock:
            self._long_done = self.clock()

    def training_slice_s(self) -> float | None:
        """The training slice now (None: batches run whole)."""
        return getattr(self.policy, "slice_s", None)

    def slices(self, batch: list[PendingCall]) -> int | None:
        """How many slices a batch runs in under the policy; None when it runs whole: a batch
        with a decode step; a training batch while no inference client is active, a prefill
        while no other client decodes (slices only cost throughput then)."""
        if any(c.lane == Lane.DECODE for c in batch):
            return None
        training = lane_of_batch(batch) == Lane.TRAINING
        own = {c.client for c in batch}
        rows = sum(c.rows for c in batch)
        with self.lock:
            now = self.clock()
            if not any((p.inference if training else p.decode) and client not in own
                       and p.active(now, self.active_window_s)
                       for client, p in self.presence.items()):
                return None
            key = batch[0].key
            compute_s = self.cost.estimate(key, rows, self.widths.get(key[0], 0)) \
                - self.cost.overhead_s
        count = self.policy.slices(compute_s)
        return count if count is not None and count > 1 else None

    def between_slices(self, training: bool = True) -> list[PendingCall] | None:
        """After a slice of a training batch (`training`) or of a prefill: pop the batch to run
        now, if any: the ready decode steps of one queue (they wait for their convoy here too:
        run piecemeal, 6 tenants fell into batches of 2-3), else, after a training slice, the
        ready prefills of one queue (which run in slices themselves). The rest of the queue
        stays queued. After a training slice only while training keeps its share."""
        with self.lock:
            if training and not self.share.kept():
                return None
            prefills = None
            for queue, wait in self._scan(self.clock()):
                if wait > 0:
                    continue
                if any(c.lane == Lane.DECODE for c in queue):
                    return self._pop(queue, Lane.DECODE, training)
                if training and prefills is None and any(c.lane == Lane.PREFILL for c in queue):
                    prefills = queue
            return self._pop(prefills, Lane.PREFILL, training) if prefills is not None else None

    def _pop(self, queue: deque[PendingCall], lane: Lane, training: bool) -> list[PendingCall]:
        """The calls of `lane` out of `queue` (the others stay queued), as a batch run now
        between the slices of a training batch (`training`) or of a prefill."""
        taken = [c for c in queue if c.lane == lane]
        rest = [c for c in queue if c.lane != lane]
        queue.clear()
        queue.extend(rest)
        if not queue:
            del self.busy[taken[0].key]
        for call in taken:
            self.presence[call.client].queued -= 1
        return taken

    def count_slice(self, seconds: float) -> None:
        """A slice of a training batch computed for `seconds`: training's for the share."""
        with self.lock:
            self.share.sliced(seconds)

    def ready_in(self) -> float | None:
        """Seconds until a batch may be ready (0: now); None when nothing is queued."""
        if not self.busy:
            return None
        with self.lock:
            waits = [wait for _, wait in self._scan(self.clock())]
            return max(0.0, min(waits)) if waits else None

    def observe(self, batch: list[PendingCall], seconds: float) -> None:
        """`batch` computed for `seconds` (a training batch's slices counted already)."""
        with self.lock:
            self.share.ran(all(c.kind == CallKind.TRAINING for c in batch), seconds)
            self.cost.observe(batch[0].key, sum(c.rows for c in batch), seconds,
                              decode=all(c.lane == Lane.DECODE and c.rows <= DECODE_ROWS
                                         for c in batch))
            now = self.clock()
            if batch[0].kind == CallKind.TRAINING:
                self._long_done = now
            for call in batch:
                if (me := self.presence.get(call.client)) is not None:
                    me.served = now
            if now >= self._next_forget:
                self._next_forget = now + 1.0
                forget_departed(self.presence, now)

    def depth(self) -> int:
        with self.lock:
            return sum(len(q) for q in self.queues.values())

    def depart(self, client: bytes) -> None:
        """`client` said goodbye or hung up: no batch waits for it from now on."""
        with self.lock:
            if (me := self.presence.get(client)) is not None:
                me.depart()

    # -- internals -----------------------------------------------------------------------------

    def _scan(self, now: float) -> Iterator[tuple[deque[PendingCall], float]]:
        """Each non-empty queue with the seconds it should still wait (<= 0: ready); a
        training queue waits while decode steps are due (`readiness.training_holds`) and, on
        the idle twin, while the serving executor holds it; a flex queue, up to starving, while
        decode steps are due; while the twin is owed training's floor, the others leave it the
        host (up to starving)."""
        held: list[tuple[deque[PendingCall], float, Lane]] = []
        convoy_until = now  # when the last decode step waiting for its convoy runs at the latest
        owed = self.share.owed()
        for queue, wait in queue_waits(self, now):
            lane = lane_of_batch(queue)
            starving = now - queue[0].arrived >= self.starvation_s
            if lane == Lane.TRAINING or (lane == Lane.FLEX and not starving):
                held.append((queue, wait, lane))
                continue
            if owed and not starving:
                wait = max(wait, TWIN_TURN_S)
            if lane == Lane.DECODE and wait > 0:
                convoy_until = max(convoy_until, now + wait)
            yield queue, wait
        yield from held_waits(self, now, convoy_until, held)

    def hold_training(self) -> bool:
        """Between a training batch's slices: wait while a decode step is about to come
        (`readiness.training_holds`), until one is queued; whether it waited."""
        with self.lock:
            now = self.clock()
            convoy_until = max((now + wait for queue, wait in queue_waits(self, now)
                                if wait > 0 and lane_of_batch(queue) == Lane.DECODE),
                               default=now)
            hold = training_holds(self, now, convoy_until)
            if hold <= 0:
                return False
            self.decode_came.wait(hold)
            return True

    def _choose(self, ready: list[deque[PendingCall]], now: float) -> deque[PendingCall]:
        oldest = min(ready, key=lambda q: q[0].seq)
        if now - oldest[0].arrived >= self.starvation_s:
            return oldest
        inference = [q for q in ready if any(c.kind == CallKind.INFERENCE for c in q)]
        training = [q for q in ready if q not in inference]
        pool = training if training and (not inference or not self.share.kept()) else inference
        return min(pool, key=lambda q: self.policy.order(q, self._progress(q[0].key)))

    def _progress(self, key: Key) -> int:
        """How far through a pass a call at `key` is: forward in layer order, then backward."""
        layer, op = key
        position = self.positions.get(layer, layer)
        if op == Op.BACKWARD:
            return 2 * len(self.positions) - position
        return position

"""Batching policies: when may a queue of calls for one layer run, and how long may a call wait.

- eager: run whatever is queued now, never wait (the paper's "no lockstep").
- lockstep: run a layer when every active client has a call there (or the cap expires, or the
  missing ones wait in other queues).
- opportunistic (default): a call may wait for company within a budget that grows with its size
  and kind (a decode call waits little; prefill and training, whose own compute is long, may wait
  longer), capped by `max_wait`; and it never waits when no client is expected to join it.
  Decode steps wait longer (up to `max_wait`) for decode clients behind them in the pass or due
  soon (`Scheduler`): every decoding tenant then shares one batch per layer. Training calls wait
  up to `max_wait` for every trainer computing its own part (`executor.readiness`): the jobs
  then move through the model together, one batch per layer.
  Among ready queues, decode steps run before prefills and large batches, flex requests' calls
  after both, and small steps' training calls before large steps' (`large_steps`); and a
  training batch runs in slices of about `slice_s` of compute (sized to the decode target,
  `executor.targets`; cut into bands of output columns where it is one matmul,
  `executor.columns`), with the decode steps, then the prefills that became ready run between
  slices (training keeps its share of the compute time), so a token never waits behind a whole
  256-row training matmul; a prefill beside decoding tenants runs in slices too
  (`executor.interleave`). While training has more than its share, a training batch waits for
  the decode steps due within `convoy_s` before it starts and between its slices
  (`Scheduler.hold_training`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

from executor.calls import PendingCall
from executor.lanes import Lane, lane_of_batch
from executor.readiness import TRAINING_CONVOY_ROWS
from executor.targets import LatencyTargets, SliceTuner
from wire.call.messages import CallKind, Op


@dataclass
class CostModel:
    """Seconds a call of `rows` takes on a layer: overhead + rows x per_row, learned online."""

    flops_per_s: float = 50e9  # prior until a layer has been measured
    overhead_s: float = 30e-6
    smoothing: float = 0.2
    _per_row: dict[tuple[int, Op], float] = field(default_factory=dict)
    _decode_batch: dict[tuple[int, Op], float] = field(default_factory=dict)

    def estimate(self, key: tuple[int, Op], rows: int, width_product: int) -> float:
        per_row = self._per_row.get(key)
        if per_row is None:
            per_row = 2 * width_product / self.flops_per_s
        return self.overhead_s + rows * per_row

    def observe(self, key: tuple[int, Op], rows: int, seconds: float,
                decode: bool = False) -> None:
        """`decode`: a batch of skinny decode steps only (also learned whole: `decode_batch_s`;
        not a packed step's, whose chunk makes it a prefill's size)."""
        if rows <= 0:
            return
        per_row = max(seconds - self.overhead_s, 0.0) / rows
        self._per_row[key] = self._smooth(self._per_row.get(key), per_row)
        if decode:
            self._decode_batch[key] = self._smooth(self._decode_batch.get(key), seconds)

    def decode_batch_s(self, key: tuple[int, Op]) -> float:
        """What one more batch of decode steps at `key` costs, as the last ones took (0 before
        any): skinny matmuls cost about the same for one row as for eight (the weights' reads)."""
        return self._decode_batch.get(key, 0.0)

    def _smooth(self, old: float | None, new: float) -> float:
        return new if old is None else old + self.smoothing * (new - old)


@dataclass(frozen=True)
class Budgets:
    max_wait_s: float = 0.020
    decode_wait_s: float = 0.0003  # base budget of an inference call
    training_wait_s: float = 0.002  # base budget of a training call
    wait_fraction: float = 0.25  # plus this fraction of the call's own estimated compute

    def budget(self, call: PendingCall, own_compute_s: float) -> float:
        base = self.training_wait_s if call.kind == CallKind.TRAINING else self.decode_wait_s
        return min(self.max_wait_s, base + self.wait_fraction * own_compute_s)


class Policy:
    name = "eager"
    convoy_s = 0.0  # a decode step waits up to this long for decode clients behind it or due

    def deadline(self, call: PendingCall, own_compute_s: float) -> float:
        """The latest time this call should start."""
        return call.arrived

    def order(self, queue: list[PendingCall], progress: int) -> tuple:
        """Among ready queues, the smallest key runs first. Default: first come, first served."""
        return (queue[0].seq,)

    def ready(self, calls: list[PendingCall], now: float, deadline: float,
              joiners: Iterable[bytes], settled: set[bytes], active: set[bytes]) -> bool:
        """Whether a queue may run before its deadline (past it, every queue is ready).
        `settled`: the clients that cannot come before it runs (queued here or elsewhere)."""
        return True

    def slices(self, compute_s: float) -> int | None:
        """How many slices a training batch of `compute_s` runs in, between which decode steps
        may run; None: whole."""
        return None


class Eager(Policy):
    pass


@dataclass
class Opportunistic(Policy):
    budgets: Budgets = field(default_factory=Budgets)
    # training batches run in slices of the tuner's size (None: whole)
    tuner: SliceTuner | None = field(
        default_factory=lambda: SliceTuner(LatencyTargets().decode_s))
    name = "opportunistic"

    @property
    def convoy_s(self) -> float:
        return self.budgets.max_wait_s

    def deadline(self, call: PendingCall, own_compute_s: float) -> float:
        return call.arrived + self.budgets.budget(call, own_compute_s)

    def ready(self, calls, now, deadline, joiners, settled, active) -> bool:
        # no one expected to come here soon: waiting would only add latency
        return now >= deadline or not any(True for _ in joiners)

    def order(self, queue: list[PendingCall], progress: int) -> tuple:
        # Decode steps first: a token's latency is the sum of its ~50 calls' waits, while a
        # prefill or a large batch hardly notices a short delay (the starvation bound keeps it
        # from waiting long); flex requests' calls after the others. Among training queues, small
        # steps' calls before large ones' (`large_steps`). Then farthest behind first: clients
        # ahead in the model wait (they are busy anyway) while those behind catch up, so scattered
        # clients converge into one batch per layer.
        lane = lane_of_batch(queue)
        return (lane != Lane.DECODE, lane == Lane.FLEX,
                lane == Lane.TRAINING and large_steps(queue), progress, queue[0].seq)

    @property
    def slice_s(self) -> float | None:
        return self.tuner.slice_s if self.tuner is not None else None

    def slices(self, compute_s: float) -> int | None:
        if self.tuner is None:
            return None
        return math.ceil(compute_s / self.tuner.slice_s)


@dataclass
class Lockstep(Policy):
    cap_s: float = 0.100
    name = "lockstep"

    def deadline(self, call: PendingCall, own_compute_s: float) -> float:
        return call.arrived + self.cap_s

    def ready(self, calls, now, deadline, joiners, settled, active) -> bool:
        # every active client is here, or waits in another queue: waiting would only stall (two
        # groups at two layers would each wait for the other until the cap)
        return now >= deadline or active <= settled

    def order(self, queue: list[PendingCall], progress: int) -> tuple:
        # farthest behind first: the group ahead waits until the one behind reaches it
        return (progress, queue[0].seq)


def make_policy(name: str, budgets: Budgets, targets: LatencyTargets | None = None,
                slice_s: float | None = None) -> Policy:
    """`slice_s`: the training slice to start from (None: the decode target; 0: never slice)."""
    if name == "eager":
        return Eager()
    if name == "lockstep":
        return Lockstep(cap_s=max(budgets.max_wait_s * 5, 0.05))
    if name == "opportunistic":
        target = (targets or LatencyTargets()).decode_s
        tuner = None if slice_s == 0 else SliceTuner(target, slice_s)
        return Opportunistic(budgets, tuner=tuner)
    raise ValueError(f"unknown policy {name!r}")


def large_steps(queue: Iterable[PendingCall]) -> bool:
    """Whether every call queued is of `TRAINING_CONVOY_ROWS` rows or more: a large step's,
    whose batch runs near its products' best rate. A small step's call beside it runs first:
    it takes a fraction of the large batch's time, and its trainer gets back to its own part
    while the large batch keeps the executor busy (a 1 x 32 job beside a 2 x 128 one, 2-core
    AMD EPYC, three runs each in turn: the small job 49.8 / 51.4 / 52.1 against 45.3 / 47.4 /
    46.3 tok/s, the large one 102-108 against 103-108)."""
    return all(c.rows >= TRAINING_CONVOY_ROWS for c in queue)

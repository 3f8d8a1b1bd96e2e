"""What runs between the slices of a long batch (`Engine.execute`'s `between`).

Between a training batch's slices: the ready decode steps, then the ready prefills, while training
keeps its share of the compute time (`Scheduler.between_slices`). A prefill beside decoding tenants
runs in slices itself, with only the ready decode steps between them. So neither a decode step nor a
prefill waits behind a whole training batch, and a decode step waits behind no whole prefill: at
most one slice of either (the slice is sized to the decode target, `executor.targets`). While
training has more than its share, a training batch then waits for a decode step about to come before
its next slice (`Scheduler.hold_training`; counted in the stats), so a token's next call does not
find a slice begun in the gap before it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from executor.calls import PendingCall
from executor.engine import Engine, Reply
from executor.lanes import Lane, lane_of_batch
from executor.scheduler import Scheduler

log = logging.getLogger("executor.interleave")


class Interleave:
    def __init__(self, scheduler: Scheduler, engine: Engine,
                 reply: Callable[[list[Reply]], None],
                 let_receive: Callable[[], None] = lambda: None) -> None:
        self.scheduler = scheduler
        self.engine = engine
        self.reply = reply  # sends the socket calls' replies
        # before a wait for a decode step: the other serving thread must be the one receiving
        self.let_receive = let_receive

    def between(self, batch: list[PendingCall]) -> Callable[[float], None]:
        """What runs between `batch`'s slices, if the scheduler slices it."""
        if lane_of_batch(batch) == Lane.TRAINING:
            return self._after_training_slice
        return self._after_prefill_slice

    def _after_training_slice(self, seconds: float) -> None:
        self.scheduler.count_slice(seconds)
        self._run(training=True)

    def _after_prefill_slice(self, seconds: float) -> None:
        self._run(training=False)

    def _run(self, training: bool) -> None:
        try:
            while True:
                while (batch := self.scheduler.between_slices(training)) is not None:
                    between = self._after_prefill_slice if batch[0].lane == Lane.PREFILL \
                        else None
                    self.reply(self.engine.execute(batch, between=between))
                if not training:
                    return
                self.let_receive()
                held = time.perf_counter()
                if not self.scheduler.hold_training():
                    return
                self.engine.stats.record_hold(time.perf_counter() - held)
        except Exception:  # the sliced batch goes on regardless
            log.exception("batches between slices")

"""A scheduler driven by a fake clock, and calls queued on it, for the scheduling tests."""

from __future__ import annotations

import torch

from executor.calls import PendingCall
from executor.policy import Budgets
from executor.scheduler import Scheduler
from wire.call.messages import Call, CallKind, Op

INF, TRAIN = CallKind.INFERENCE, CallKind.TRAINING
BUDGETS = Budgets(max_wait_s=0.020, decode_wait_s=0.0003, training_wait_s=0.002,
                  wait_fraction=0.25)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def scheduler(policy, clock: Clock, **kw) -> Scheduler:
    return Scheduler(policy, clock=clock, widths={0: 64 * 64, 1: 64 * 64, 2: 64 * 64}, **kw)


def call(s: Scheduler, client: str, layer: int, rows: int = 1, kind: CallKind = INF,
         op: Op = Op.FORWARD, decode_us: int = 0, decode: bool = False) -> PendingCall:
    """A call queued now; `decode_us`: the decode target its tenants ask for (0: none);
    `decode`: marked a decode step's by its worker."""
    pending = PendingCall(client.encode(), Call(0, op, layer, kind, "float32", (rows, 1),
                                                decode_target_us=decode_us, decode=decode),
                          torch.empty(rows, 1), s.clock())
    s.add(pending)
    return pending


def clients_of(batch) -> list[str]:
    return [c.client.decode() for c in batch]


def walk_with_gaps(s: Scheduler, clock: Clock, rounds: int = 3) -> None:
    """Clients a and b walk layers 0 -> 1 together, each calling 2 ms after its reply (1 ms of
    compute a batch): the scheduler learns their gaps, so each is due 2 x 2 ms + slack after."""
    for _ in range(rounds):
        for layer in (0, 1):
            batch = [call(s, "a", layer), call(s, "b", layer)]
            assert s.next_batch() == batch
            s.observe(batch, 0.001)
            clock.advance(0.002)

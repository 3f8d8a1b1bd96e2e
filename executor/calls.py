"""A call waiting in the executor: who asked, what to run, and its rows; a batch of them."""

from __future__ import annotations

from collections import deque

import torch

from wire.call.messages import Call, CallKind, Op


class PendingCall:
    """What the scheduler and the engine read of a call, computed once when it arrives."""

    __slots__ = (
        "arrived",
        "client",
        "deadline",
        "header",
        "keepalive",
        "key",
        "kind",
        "lane",
        "layer",
        "op",
        "reply_seq",
        "rows",
        "seq",
        "target_s",
        "x",
    )

    def __init__(self, client: bytes, header: Call, x: torch.Tensor, arrived: float,
                 seq: int = 0, deadline: float = 0.0, keepalive: object = None,
                 reply_seq: int = -1) -> None:
        self.client = client  # ZeroMQ identity of the worker
        self.header = header
        self.x = x  # [rows, in] (ids: [rows]); a view into shared memory or a frame
        self.arrived = arrived  # scheduler clock, seconds
        self.seq = seq
        self.deadline = deadline  # the latest start the batching policy allows
        self.keepalive = keepalive  # the frame that backs `x`
        self.reply_seq = reply_seq  # a doorbell call: the seq of its reply (-1: socket call)
        self.layer: int = header.layer
        self.op: Op = header.op
        self.kind: CallKind = header.kind
        self.key: tuple[int, Op] = (self.layer, self.op)
        self.rows: int = x.shape[0]
        self.lane = lane_for(self.kind, self.rows, header.decode, header.flex)
        self.target_s = own_target_s(header, self.lane)

    def __repr__(self) -> str:
        return f"PendingCall(layer={self.layer}, op={self.op}, rows={self.rows})"


DECODE_ROWS = 32  # an inference call of at most this many rows is taken for a decode step


def lane_for(kind: int, rows: int, decode: bool = False, flex: bool = False) -> int:
    """0: decode step, 1: prefill, 2: training, 3: flex (`executor.lanes.Lane`). An inference
    call its worker marks a decode step is one whatever its rows (a large batch's, or one with
    prompts' chunks packed beside its rows); an unmarked one is taken for one by its rows; one
    it marks flex (flex requests' rows only) is flex whatever else it is."""
    if kind == CallKind.TRAINING:
        return 2
    if flex:
        return 3
    return 0 if decode or rows <= DECODE_ROWS else 1


def own_target_s(header: Call, lane: int) -> float | None:
    """The wait the call's tenants allow it in its lane, in seconds; None: the executor's own
    target for the lane (training has none)."""
    us = header.decode_target_us if lane == 0 else header.prefill_target_us if lane == 1 else 0
    return us * 1e-6 if us > 0 else None


def take(queue: deque[PendingCall], max_rows: int) -> list[PendingCall]:
    """A batch out of `queue`: all of it, or past `max_rows` rows its clients' calls taken
    round-robin (a client flooding one layer cannot crowd others out); the rest stays queued."""
    if len(queue) == 1:
        return [queue.popleft()]
    if sum(c.rows for c in queue) <= max_rows:
        batch = list(queue)
        queue.clear()
        return batch
    by_client: dict[bytes, deque[PendingCall]] = {}
    for call in queue:
        by_client.setdefault(call.client, deque()).append(call)
    batch, rows = [], 0
    while any(by_client.values()):
        progressed = False
        for calls in by_client.values():
            if calls and (not batch or rows + calls[0].rows <= max_rows):
                call = calls.popleft()
                batch.append(call)
                rows += call.rows
                progressed = True
        if not progressed:
            break
    taken = set(map(id, batch))
    remaining = [c for c in queue if id(c) not in taken]
    queue.clear()
    queue.extend(remaining)
    return batch

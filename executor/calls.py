"""A call waiting in the executor: who asked, what to run, and its rows."""

from __future__ import annotations

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
        self.lane = lane_for(self.kind, self.rows)

    def __repr__(self) -> str:
        return f"PendingCall(layer={self.layer}, op={self.op}, rows={self.rows})"


DECODE_ROWS = 32  # an inference call of at most this many rows is a decode step


def lane_for(kind: int, rows: int) -> int:
    """0: decode step, 1: prefill, 2: training (`executor.lanes.Lane`)."""
    if kind == CallKind.TRAINING:
        return 2
    return 0 if rows <= DECODE_ROWS else 1

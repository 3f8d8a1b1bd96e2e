"""A call waiting in the executor: who asked, what to run, and its rows."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from wire.executor import Call, CallKind, Op


@dataclass(eq=False)
class PendingCall:
    client: bytes  # ZeroMQ identity of the worker
    header: Call
    x: torch.Tensor  # [rows, in] (ids: [rows]); a view into shared memory or a frame
    arrived: float  # scheduler clock, seconds
    seq: int = 0
    deadline: float = 0.0  # the latest start the batching policy allows
    keepalive: object = field(default=None, repr=False)  # the frame that backs `x`

    @property
    def key(self) -> tuple[int, Op]:
        return self.header.layer, self.header.op

    @property
    def layer(self) -> int:
        return self.header.layer

    @property
    def rows(self) -> int:
        return self.x.shape[0]

    @property
    def kind(self) -> CallKind:
        return self.header.kind

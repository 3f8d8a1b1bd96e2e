"""The compute loop: take a batch from the scheduler, run its rows as one matmul, reply to each.

Rows of all calls in a batch are concatenated (no padding), run through one base layer, and the
result is split back by row counts. Results go into each client's shared memory when it has one,
else into a reply frame; the caller sends the replies. A batch the scheduler slices runs as
several matmuls over consecutive rows, with `between` called after each slice but the last (the
server runs ready decode steps there).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import torch

from executor.calls import PendingCall
from executor.clients import ClientTable
from executor.registry import LayerRegistry
from executor.scheduler import Scheduler
from executor.stats import ExecutorStats
from wire import executor as P
from wire.tensors import as_bytes, name_of

log = logging.getLogger("executor.engine")

Reply = tuple[bytes, list]  # (client identity, frames after the identity)


class Engine:
    def __init__(self, registry: LayerRegistry, scheduler: Scheduler, clients: ClientTable,
                 stats: ExecutorStats, device: str = "cpu") -> None:
        self.registry = registry
        self.scheduler = scheduler
        self.clients = clients
        self.stats = stats
        self.device = torch.device(device)

    def execute(self, batch: list[PendingCall],
                between: Callable[[], None] | None = None) -> list[Reply]:
        started = self.scheduler.clock()
        layer = self.registry.get(batch[0].header.layer)
        op = batch[0].header.op
        size = self.scheduler.slice_rows(batch) if between is not None else None
        elapsed = 0.0
        try:
            x = self._inputs(batch)
            step = size or max(x.shape[0], 1)  # an empty call still runs once
            parts = []
            for start in range(0, max(x.shape[0], 1), step):
                if parts:
                    between()
                tick = time.perf_counter()
                parts.append(self.registry.run(op, layer, x[start:start + step]))
                elapsed += time.perf_counter() - tick
            y = parts[0] if len(parts) == 1 else torch.cat(parts)
            if y.device.type != "cpu":
                y = y.cpu()
        except Exception as exc:  # one bad batch must not stop the executor
            log.exception("layer %s op %s failed", layer.spec.name, op.name)
            self.stats.record_error()
            error = f"{type(exc).__name__}: {exc}"
            return [(c.client, [P.encode(P.Error(c.header.id, P.ErrorCode.INTERNAL, error))])
                    for c in batch]
        self.scheduler.observe(batch, elapsed)
        self.stats.record_batch(batch, started, elapsed)
        replies, start = [], 0
        for call in batch:
            rows = y[start:start + call.rows]
            start += call.rows
            replies.append((call.client, self._result(call, rows)))
        return replies

    def _inputs(self, batch: list[PendingCall]) -> torch.Tensor:
        is_float = batch[0].x.is_floating_point()
        dtype = self.registry.dtype if is_float else None
        if len(batch) == 1:
            return batch[0].x.to(device=self.device, dtype=dtype)
        return torch.cat([c.x.to(device=self.device, dtype=dtype) for c in batch])

    def _result(self, call: PendingCall, rows: torch.Tensor) -> list:
        dtype, shape = name_of(rows.dtype), tuple(rows.shape)
        client = self.clients.get(call.client)
        if call.header.shm_out >= 0 and client is not None and client.shm is not None:
            try:
                client.shm.view(call.header.shm_out, rows.dtype, shape).copy_(rows)
                return [P.encode(P.Result(call.header.id, dtype, shape, True))]
            except ValueError:  # the client left (its memory closed) while its call ran
                return [P.encode(P.Error(call.header.id, P.ErrorCode.UNKNOWN_CLIENT, "gone"))]
        return [P.encode(P.Result(call.header.id, dtype, shape, False)), as_bytes(rows)]

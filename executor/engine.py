"""The compute loop: take a batch from the scheduler, run its rows as one matmul, reply to each.

Rows of all calls in a batch are concatenated (no padding), run through one base layer, and the
result is split back by row counts. A doorbell call's result goes straight into its client's
shared memory and the client's doorbell rings; socket calls get reply frames, which the caller
sends. A batch the scheduler slices (training, or a prefill beside decoding tenants) runs as
several matmuls, each over a band of the output's columns (or of the sum inside the matmul
where the output is narrow and the sum deep, or of rows where the op is no single matmul:
`executor.columns`), with `between` called after each slice but the last (what runs there:
`executor.interleave`).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable

import torch

from executor.calls import PendingCall
from executor.clients import ClientTable
from executor.columns import Columns, row_bands
from executor.registry import LayerRegistry
from executor.scheduler import Scheduler
from executor.sharding import ShardsBroken
from executor.stats import ExecutorStats
from wire.call import device as D
from wire.call import messages as P
from wire.call.header import CODE_OF
from wire.call.tensors import as_bytes, name_of
from wire.call.threads import copy_threads, one_thread

log = logging.getLogger("executor.engine")
# A batch of several calls has its op write each call's rows into the call's memory itself
# (`Joined.into_rows`) where every call's result is at least this large: below it a join per
# call costs more in dispatch than the copy it saves (a decode step's row: 7 us against 0.3).
IN_PLACE_CALL_BYTES = 64 * 2**10

Reply = tuple[bytes, list]  # (client identity, frames after the identity)


class Engine:
    def __init__(self, registry: LayerRegistry, scheduler: Scheduler, clients: ClientTable,
                 stats: ExecutorStats, device: str = "cpu") -> None:
        self.registry = registry
        self.scheduler = scheduler
        self.clients = clients
        self.stats = stats
        self.device = torch.device(device)
        self._runners = registry.runners()
        self._columns = registry.columns()
        self._result_code = CODE_OF[registry.dtype]

    def execute(self, batch: list[PendingCall],
                between: Callable[[float], None] | None = None) -> list[Reply]:
        """Run the batch; answer its doorbell calls; return the socket calls' replies."""
        started = self.scheduler.clock()
        first = batch[0]
        run = self._runners[first.layer][first.op]
        count = self.scheduler.slices(batch) if between is not None else None
        outs = self._in_place(batch, run) if count is None else None
        try:
            x = self._inputs(batch)
            if outs is not None:
                into = (lambda x: run.into(x, outs[0])) if len(outs) == 1 \
                    else (lambda x: run.into_rows(x, outs))
                y, elapsed = D.timed(into, x, self.device)
                y = outs[0]  # the first call's rows: the shape its replies name
            elif count is None:  # an empty call runs once too: it gets an empty result
                y, elapsed = D.timed(run, x, self.device)
            elif (columns := self._columns[first.layer].get(first.op)) is not None:
                y, elapsed = self._by_columns(columns, x, count, between)
            else:
                y, elapsed = self._by_rows(run, x, count, between)
        except ShardsBroken as exc:  # the group is going down: the caller may go elsewhere
            self.stats.record_error()
            return self._fail(batch, str(exc), P.ErrorCode.UNAVAILABLE)
        except Exception as exc:  # one bad batch must not stop the executor
            log.exception("layer %d op %s failed", first.layer, first.op)
            self.stats.record_error()
            return self._fail(batch, f"{type(exc).__name__}: {exc}")
        self.scheduler.observe(batch, elapsed)
        self.scheduler.observe_waits(batch, started)
        self.stats.record_batch(batch, started, elapsed)
        with copy_threads(y):
            return self._deliver(batch, y, outs is not None)

    def _in_place(self, batch: list[PendingCall], run) -> list[torch.Tensor] | None:
        """Each call's result region, in the batch's order, where the op writes the results
        there itself: doorbell calls on the host, and an op that can (`into`: a lone call's
        linear layer, stretch, lead or greedy step, whose last step joins parts; `into_rows`:
        several calls' joined parts, each call's result `IN_PLACE_CALL_BYTES` or more). Else
        None: the results are written after."""
        first, several = batch[0], len(batch) > 1
        if self.device.type != "cpu" or not hasattr(run, "into_rows" if several else "into"):
            return None
        spec = self.registry.layers[first.layer].spec
        width = spec.in_features if first.op == P.Op.BACKWARD else spec.out_features
        dtype = self.registry.dtype
        if several and min(c.rows for c in batch) * width * dtype.itemsize < IN_PLACE_CALL_BYTES:
            return None
        outs = []
        for call in batch:
            client = self.clients.get(call.client) if call.reply_seq >= 0 else None
            port = client.port if client is not None else None
            if port is None or port.device_buffer is not None:
                return None
            try:
                outs.append(port.view(call.header.shm_out, dtype, call.rows, width))
            except ValueError:  # checked when the call came; its memory is gone since
                return None
        return outs

    def _by_columns(self, columns: Columns, x: torch.Tensor, count: int,
                    between: Callable[[float], None]) -> tuple[torch.Tensor, float]:
        """`x` through `columns` a band at a time, with `between` after each band but the last.
        On a CPU each band runs on one thread: slices only happen beside inference workers,
        whose own work holds cores, and a second matmul thread waiting for one of them stalls the
        band (6 tenants + 2 jobs, 2 cores, 20 s: training 23.6 -> 46.8 tok/s, the tenants' per-
        token latency 1.00x -> 1.13x of 8 tenants alone; bench NOTES)."""
        y, elapsed, seconds = columns.empty(x), 0.0, 0.0
        cpu, inner = self.device.type == "cpu", columns.inner(count)
        for i, band in enumerate(columns.bands(count)):
            if i:
                self._between(between, seconds)
            with one_thread() if cpu else contextlib.nullcontext():
                seconds = D.timed(lambda x, band=band: columns.run(x, band, y, inner), x,
                                  self.device)[1]
            elapsed += seconds
        return y, elapsed

    def _by_rows(self, run, x: torch.Tensor, count: int,
                 between: Callable[[float], None]) -> tuple[torch.Tensor, float]:
        """`x` in bands of rows, with `between` after each band but the last."""
        parts, elapsed, seconds = [], 0.0, 0.0
        for start, stop in row_bands(x.shape[0], count):
            if parts:
                self._between(between, seconds)
            y, seconds = D.timed(run, x[start:stop], self.device)
            parts.append(y)
            elapsed += seconds
        return (parts[0] if len(parts) == 1 else torch.cat(parts)), elapsed

    def _between(self, between: Callable[[float], None], seconds: float) -> None:
        """After a slice that computed for `seconds`."""
        self.scheduler.slice_ran()  # the calls run now waited behind a slice
        between(seconds)

    def _inputs(self, batch: list[PendingCall]) -> torch.Tensor:
        """Rows from host memory and from clients' device buffers alike, on this device."""
        x = D.gather([c.x for c in batch], self.device)
        if x.is_floating_point() and x.dtype != self.registry.dtype:
            x = x.to(self.registry.dtype)
        return x

    def _deliver(self, batch: list[PendingCall], y: torch.Tensor,
                 in_place: bool = False) -> list[Reply]:
        """Each call's rows to its client: doorbell results are written first, then (after one
        wait for the device) published; socket calls' replies are returned. A batch of several
        calls on the host sends each its rows as bytes of the batch's result (no tensor op per
        call); a lone call copies its whole result, which costs less than taking bytes; unless
        the op wrote every call's rows into its memory itself (`in_place`: `y` is then the first
        call's, for the shape)."""
        replies: list[Reply] = []
        written = []
        ndim, cols = y.dim(), (y.shape[1] if y.dim() == 2 else 0)
        single = len(batch) == 1
        host = not single and not in_place and y.device.type == "cpu"
        if host:
            y = y.detach() if y.requires_grad else y
            y = y if y.is_contiguous() else y.contiguous()
            data = memoryview(y.view(torch.uint8).numpy()).cast("B") if y.numel() else b""
            row_bytes = y.element_size() * max(cols, 1)
        start = 0
        for call in batch:
            first, start = start, start + call.rows
            if call.reply_seq < 0:
                rows = y if single else y[first:start]
                replies.append((call.client, self._result(call, rows.cpu())))
                continue
            client = self.clients.get(call.client)
            port = client.port if client is not None else None
            if port is None:
                continue  # it left while its call ran
            if in_place:
                written.append((call, port))
                continue
            try:
                if host and port.device_buffer is None:
                    port.write_bytes(call.header.shm_out,
                                     data[first * row_bytes:start * row_bytes])
                else:
                    port.write(call.header.shm_out, y if single else y[first:start])
                written.append((call, port))
            except (ValueError, RuntimeError, OSError, TypeError, IndexError) as exc:
                log.info("client %s left before its reply (%s)", client.name, exc)
        D.synchronize(self.device)  # the results are in the clients' memory
        self.clients.settle()  # no copy is in flight now: unpin what clients let go
        for call, port in written:
            try:
                port.publish(call.reply_seq, call.header.id, self._result_code, ndim, call.rows,
                             cols)
            except (ValueError, OSError, TypeError) as exc:
                log.info("client of call %d left before its reply (%s)", call.header.id, exc)
        return replies

    def _fail(self, batch: list[PendingCall], error: str,
              code: P.ErrorCode = P.ErrorCode.INTERNAL) -> list[Reply]:
        replies = []
        for call in batch:
            if call.reply_seq < 0:
                replies.append((call.client, [P.encode(P.Error(call.header.id, code, error))]))
                continue
            client = self.clients.get(call.client)
            if client is not None and client.port is not None:
                client.port.refuse(call.reply_seq, call.header.id, code, error)
        return replies

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

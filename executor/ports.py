"""A same-host client's calls through its shared memory: the header read in place, the input
and the result as views cached by shape, the reply header written in place and the doorbell
rung. One port per doorbell client; rebuilt when the client's memory is remapped.

A client on a GPU shares a call buffer on its device (`wire.call.cuda_ipc`): the headers stay in
shared memory, and the offsets in them point into that buffer instead."""

from __future__ import annotations

import torch

from wire.call.cuda_ipc import DeviceBuffer
from wire.call.doorbell import ExecutorDoorbell
from wire.call.header import OK, REQUEST_AT, SEQ, publish_reply, read_call, write_error
from wire.call.messages import ErrorCode
from wire.call.shm import ShmBuffer
from wire.call.tensors import nbytes

Header = tuple[int, ...]  # callheader.read_call: seq, id, op, kind, dtype, ndim, layer, ...


class DoorbellPort:
    def __init__(self, shm: ShmBuffer, doorbell: ExecutorDoorbell,
                 device_buffer: DeviceBuffer | None = None) -> None:
        self.shm = shm
        self.doorbell = doorbell
        self.mapped = shm.raw
        self.last_seq = 0
        self._views: dict[tuple[int, torch.dtype, int, int], torch.Tensor] = {}
        self.use(device_buffer)

    def use(self, device_buffer: DeviceBuffer | None) -> None:
        """Tensors in the client's device buffer from the next call on (None: in the shared
        memory); the call count goes on, as the headers stay where they were."""
        self.device_buffer = device_buffer
        self.data: ShmBuffer | DeviceBuffer = device_buffer or self.shm
        self.size = self.data.size
        self._views = {}

    def pending(self) -> bool:
        """Whether the client has published its next call (no system call)."""
        return SEQ.unpack_from(self.mapped, REQUEST_AT)[0] == self.last_seq + 1

    def take(self) -> Header | None:
        """The client's next call (a snapshot of its header), None if it has not published one
        (a stale ring)."""
        header = read_call(self.mapped, self.last_seq + 1)
        if header is not None:
            self.last_seq += 1
        return header

    def view(self, offset: int, dtype: torch.dtype, rows: int, cols: int) -> torch.Tensor:
        """A [rows, cols] view (ids: [rows] when cols is 0) at `offset`; ValueError when it
        does not lie inside the segment or is misaligned."""
        key = (offset, dtype, rows, cols)
        view = self._views.get(key)
        if view is None:
            shape = (rows, cols) if cols else (rows,)
            if offset < 0 or offset % 64 or offset + nbytes(dtype, shape) > self.size:
                raise ValueError(f"shared memory region at {offset} for {list(shape)} "
                                 f"{dtype} is outside the segment")
            if len(self._views) > 256:  # shapes vary (prefills): keep the cache bounded
                self._views.clear()
            view = self.data.view(offset, dtype, shape)
            self._views[key] = view
        return view

    def write(self, offset: int, y: torch.Tensor) -> None:
        """The result into the client's memory (asynchronously where it is on a GPU or pinned:
        the caller synchronizes once for a whole batch before `publish`)."""
        rows, cols = y.shape[0], (y.shape[1] if y.dim() == 2 else 0)
        self.view(offset, y.dtype, rows, cols).copy_(y, non_blocking=True)

    def write_bytes(self, offset: int, data: memoryview) -> None:
        """A host result's bytes into the client's shared memory: one memcpy, none of a
        tensor copy's dispatch (a 1-row result: 0.3 us instead of ~5 us). The region was
        checked when the call came (`validation.check_doorbell`); the mapping bounds it too."""
        if self.device_buffer is not None or offset + len(data) > self.size:
            raise ValueError(f"result region at {offset} is outside the shared memory")
        self.mapped[offset:offset + len(data)] = data

    def publish(self, seq: int, call_id: int, dtype_code: int, ndim: int, rows: int,
                cols: int) -> None:
        publish_reply(self.mapped, seq, call_id, OK, dtype_code, ndim, rows, cols)
        self.doorbell.answer()

    def refuse(self, seq: int, call_id: int, code: ErrorCode, message: str) -> None:
        write_error(self.mapped, seq, call_id, code, message)
        self.doorbell.answer()

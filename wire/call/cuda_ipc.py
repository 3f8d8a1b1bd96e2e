"""A client's call buffer on a GPU, shared with the executor through CUDA IPC.

The client allocates one byte buffer on its device, writes a random token at its start and sends
the buffer's IPC handle with the token and its GPU's UUID (`ShareDevice`); the executor finds
that GPU among its own by UUID (the two may see different CUDA_VISIBLE_DEVICES), opens the
handle, checks that the claimed range lies inside the one allocation the handle names (asking
the driver, not the client) and that the token is there, and from then on reads a call's rows
from that buffer and writes the result back into it: no activation crosses host memory.

Nothing a client sends is used as a path: torch's consumer side would release a reference
counter in a shared-memory file the producer names; the executor passes a counter file of its
own instead (so the producer keeps a grown-out-of buffer until it exits, at most the size of
the buffer that replaced it).

Every step that differs on a GPU is a call into `wire.call.device`; the rest runs on any host.
"""

from __future__ import annotations

import hmac
import math
import secrets
from collections.abc import Callable

import torch

from wire.call import device as D
from wire.call.tensors import TOKEN_BYTES

REF_COUNTERS = 10_000  # torch's CUDA_IPC_REF_COUNTER_FILE_SIZE
HANDLE_FIELDS = ("handle", "size", "offset", "event", "event_sync")


class RefusedBuffer(ValueError):
    pass


class DeviceBuffer:
    """A uint8 buffer on a device that calls' tensors are views of: the client's own (grown by
    replacement), or the executor's mapping of a client's."""

    def __init__(self, size: int, device: torch.device,
                 data: torch.Tensor | None = None) -> None:
        self.size = size
        self.device = device
        self.bytes = data if data is not None else \
            torch.zeros(size, dtype=torch.uint8, device=device)

    def view(self, offset: int, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
        end = offset + dtype.itemsize * math.prod(shape)
        if offset < 0 or end > self.size or offset % dtype.itemsize:
            raise ValueError(f"device buffer region [{offset}, {end}) is outside the buffer")
        return self.bytes[offset:end].view(dtype).view(shape)

    def export(self) -> tuple[dict, bytes]:
        """(the handle's fields with the device's UUID, the token now at the buffer's start);
        DeviceRefused where the memory cannot be shared (a CPU buffer)."""
        token = secrets.token_bytes(TOKEN_BYTES)
        self.bytes[:TOKEN_BYTES].copy_(torch.frombuffer(bytearray(token), dtype=torch.uint8))
        self.synchronize()
        fields = D.export_ipc(self.bytes.untyped_storage())
        return {"uuid": D.uuid_of(self.device), **fields}, token  # GPU only

    def synchronize(self) -> None:
        """Before another process may read what this one wrote: wait for this device's work."""
        D.synchronize(self.device)


class ExecutorCounters:
    """The executor's own reference-counter file for the buffers it opens."""

    def __init__(self) -> None:
        self._storage, self.name = D.shared_counters(8 * REF_COUNTERS)
        self._next = 0

    def take(self) -> int:
        self._next = (self._next + 1) % REF_COUNTERS
        return self._next


Opener = Callable[[int, dict, bytes, int], torch.UntypedStorage]


def open_buffer(fields: dict, token: bytes, counters: ExecutorCounters, driver: D.Driver,
                opener: Opener = D.open_ipc) -> DeviceBuffer:
    """The client's buffer, checked against the driver's view of its allocation and the token;
    RefusedBuffer for anything else. `opener` maps the handle (`wire.call.device.open_ipc`)."""
    try:
        fields = _parsed(fields, token)
        index = D.index_of(fields["uuid"])
        storage = opener(index, fields, counters.name, counters.take())
        start, size = storage.data_ptr(), fields["size"]
        base, length = driver.address_range(start, index)
    except D.DeviceRefused as exc:
        raise RefusedBuffer(str(exc)) from None
    if not base <= start or start + size > base + length:
        raise RefusedBuffer(f"the buffer claims {size} bytes past the end of its allocation")
    data = torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage, 0, (size,))
    if not hmac.compare_digest(bytes(data[:TOKEN_BYTES].cpu().numpy()), token):
        raise RefusedBuffer("wrong token")
    return DeviceBuffer(size, data.device, data)


def _parsed(fields: dict, token: bytes) -> dict:
    """The handle's fields, typed and in range, before anything touches a device."""
    if len(token) != TOKEN_BYTES:
        raise RefusedBuffer(f"a token has {TOKEN_BYTES} bytes, not {len(token)}")
    if not isinstance(fields.get("uuid"), str) or not fields["uuid"]:
        raise RefusedBuffer("the buffer names no device")
    if not isinstance(fields.get("handle"), bytes) or not fields["handle"]:
        raise RefusedBuffer("the buffer has no IPC handle")
    size, offset = fields.get("size"), fields.get("offset")
    if not isinstance(size, int) or size <= TOKEN_BYTES:
        raise RefusedBuffer(f"buffer size {size} is too small")
    if not isinstance(offset, int) or offset < 0:
        raise RefusedBuffer(f"buffer offset {offset} is not a place in an allocation")
    return {"uuid": fields["uuid"], **{f: fields[f] for f in HANDLE_FIELDS}}

"""A client's call buffer on a GPU, shared with the executor through CUDA IPC.

The client allocates one byte buffer on its device, writes a random token at its start and sends
the buffer's IPC handle with the token (`ShareDevice`); the executor opens it, checks that the
claimed range lies inside the one allocation the handle names (asking the driver, not the
client) and that the token is there, and from then on reads a call's rows from that buffer and
writes the result back into it: no activation crosses host memory.

Nothing a client sends is used as a path: torch's consumer side would release a reference
counter in a shared-memory file the producer names; the executor passes a counter file of its
own instead (so the producer keeps a grown-out-of buffer until it exits, at most the size of
the buffer that replaced it).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import hmac
import math
import secrets

import torch

from wire.shm import TOKEN_BYTES

REF_COUNTERS = 10_000  # torch's CUDA_IPC_REF_COUNTER_FILE_SIZE


class DeviceBuffer:
    """The client's side: a uint8 buffer on `device` that grows by replacement."""

    def __init__(self, size: int, device: torch.device) -> None:
        self.size = size
        self.device = device
        self.bytes = torch.zeros(size, dtype=torch.uint8, device=device)

    def view(self, offset: int, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
        end = offset + dtype.itemsize * math.prod(shape)
        if offset < 0 or end > self.size or offset % dtype.itemsize:
            raise ValueError(f"device buffer region [{offset}, {end}) is outside the buffer")
        return self.bytes[offset:end].view(dtype).view(shape)

    def export(self) -> tuple[dict, bytes]:
        """(the handle's fields, the token now at the buffer's start)."""
        token = secrets.token_bytes(TOKEN_BYTES)
        self.bytes[:TOKEN_BYTES].copy_(torch.frombuffer(bytearray(token), dtype=torch.uint8))
        torch.cuda.synchronize(self.device)
        (device, handle, size, offset, _, _, event, event_sync) = \
            self.bytes.untyped_storage()._share_cuda_()
        return {"device": int(device), "handle": bytes(handle), "size": int(size),
                "offset": int(offset), "event": bytes(event or b""),
                "event_sync": bool(event_sync)}, token

    def synchronize(self) -> None:
        """Before the executor may read what this process wrote (another process, other
        streams): wait for this device's work."""
        torch.cuda.current_stream(self.device).synchronize()


class RefusedBuffer(ValueError):
    pass


class ExecutorCounters:
    """The executor's own reference-counter file for the buffers it opens."""

    def __init__(self) -> None:
        self._storage = torch.UntypedStorage._new_shared_filename_cpu(8 * REF_COUNTERS)
        self.name: bytes = self._storage._share_filename_cpu_()[1]
        self._next = 0

    def take(self) -> int:
        self._next = (self._next + 1) % REF_COUNTERS
        return self._next


def open_buffer(fields: dict, size: int, token: bytes, counters: ExecutorCounters,
                executor_device: torch.device) -> torch.Tensor:
    """The client's buffer as a uint8 tensor on its device, or RefusedBuffer."""
    if executor_device.type != "cuda":
        raise RefusedBuffer("this executor does not run on a GPU")
    if size <= TOKEN_BYTES or size != fields["size"]:
        raise RefusedBuffer(f"buffer size {size} does not match its handle")
    if not 0 <= fields["device"] < torch.cuda.device_count():
        raise RefusedBuffer(f"no CUDA device {fields['device']} here")
    try:
        storage = torch.UntypedStorage._new_shared_cuda(
            fields["device"], fields["handle"], size, fields["offset"], counters.name,
            counters.take(), fields["event"], fields["event_sync"])
    except (RuntimeError, TypeError, ValueError) as exc:
        raise RefusedBuffer(f"the handle does not open here: {exc}") from None
    start = storage.data_ptr()
    base, length = allocation_range(start)
    if start + size > base + length:
        raise RefusedBuffer(f"the buffer claims {size} bytes past the end of its allocation")
    buffer = torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage, 0, (size,))
    if not hmac.compare_digest(bytes(buffer[:TOKEN_BYTES].cpu().numpy()), token):
        raise RefusedBuffer("wrong token")
    return buffer


def allocation_range(pointer: int) -> tuple[int, int]:
    """(base, size) of the device allocation that holds `pointer`, from the driver."""
    driver = cuda_driver()
    base, size = ctypes.c_uint64(), ctypes.c_size_t()
    status = driver.cuMemGetAddressRange_v2(ctypes.byref(base), ctypes.byref(size),
                                            ctypes.c_uint64(pointer))
    if status != 0:
        raise RefusedBuffer(f"the driver does not know this buffer (CUresult {status})")
    return base.value, size.value


@functools.cache
def cuda_driver() -> ctypes.CDLL:
    name = ctypes.util.find_library("cuda") or "libcuda.so.1"
    try:
        return ctypes.CDLL(name)
    except OSError as exc:
        raise RefusedBuffer(f"no CUDA driver library ({exc})") from None

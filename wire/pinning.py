"""Page-locking a client's shared-memory segment for an executor on a GPU.

Rows copied to the GPU from pageable memory go through a staging buffer, synchronously; from
page-locked (pinned) memory they are one asynchronous DMA, and so are results copied back, the
executor waiting once per batch before it answers. The executor registers each CPU client's
segment with the CUDA driver when it maps it and unregisters it before letting the mapping go.
The driver API is used (not the runtime's `cudaHostRegister`) so that a refusal leaves no
pending error for the runtime's next kernel launch to trip over.
"""

from __future__ import annotations

import ctypes
import logging

import torch

from wire.cuda_ipc import RefusedBuffer, cuda_driver

log = logging.getLogger("wire.pinning")
PORTABLE = 1  # CU_MEMHOSTREGISTER_PORTABLE: pinned for every context, not only the current one


def pin(pointer: int, size: int, device: torch.device) -> bool:
    """Page-lock [pointer, pointer + size) for `device`'s copies; False when refused."""
    try:
        driver = cuda_driver()
        index = device.index if device.index is not None else torch.cuda.current_device()
        torch.cuda.set_device(index)  # this thread's current context is the device's
        status = driver.cuMemHostRegister_v2(ctypes.c_void_p(pointer), ctypes.c_size_t(size),
                                             ctypes.c_uint(PORTABLE))
    except (RefusedBuffer, RuntimeError, AttributeError, ValueError) as exc:
        log.info("shared memory not pinned (%s)", exc)
        return False
    if status != 0:
        log.info("shared memory not pinned (CUresult %d)", status)
        return False
    return True


def unpin(pointer: int, device: torch.device) -> None:
    """Undo `pin` once no copy to or from the memory is in flight (waits for the device)."""
    torch.cuda.synchronize(device)
    status = cuda_driver().cuMemHostUnregister(ctypes.c_void_p(pointer))
    if status != 0:
        log.warning("shared memory at %#x not unpinned (CUresult %d)", pointer, status)

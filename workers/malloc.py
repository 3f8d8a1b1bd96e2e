"""glibc's malloc, tuned per process: how large an allocation gets a mapping of its own, how much
freed memory its heap keeps, and giving that memory back. Inference workers keep what they free
for their next KV caches (`workers.inference.memory`); trainers give large frees back at once
(`workers.training.allocator`). Elsewhere than glibc nothing is tuned."""

from __future__ import annotations

import ctypes
import ctypes.util

M_TRIM_THRESHOLD = -1  # glibc's malloc.h
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_MAX = 32 << 20  # the largest mmap threshold glibc takes on 64-bit systems


def _libc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None
    if not (hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim")):
        return None
    libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    libc.malloc_trim.argtypes = [ctypes.c_size_t]
    return libc


def mallopt(parameter: int, value: int) -> bool:
    """Set one of malloc's parameters for this process; False where malloc refuses or is not
    glibc's."""
    libc = _libc()
    return libc is not None and bool(libc.mallopt(parameter, value))


def trim() -> None:
    """Return the free memory of malloc's heap to the system."""
    libc = _libc()
    if libc is not None:
        libc.malloc_trim(0)

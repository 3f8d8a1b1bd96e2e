"""Shared memory between a worker and the executor: a file in /dev/shm, mapped by both.

The worker creates the segment and unlinks its name as soon as the executor has mapped it, so a
crash on either side never leaves a file behind; the memory goes when both mappings are gone.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import secrets
from pathlib import Path

import torch

from executor.tensors import nbytes

SHM_DIR = Path(os.environ.get("SYMBIOSIS_SHM_DIR", "/dev/shm"))
TOKEN_BYTES = 16


class ShmBuffer:
    """A mapped segment exposed as one uint8 tensor; typed views are slices of it."""

    def __init__(self, name: str, size: int, *, create: bool) -> None:
        self.name = name
        self.size = size
        path = SHM_DIR / name
        flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
        fd = os.open(path, flags, 0o600)
        try:
            if create:
                os.ftruncate(fd, size)
            elif os.fstat(fd).st_size < size:
                raise ValueError(f"shared memory {name} is smaller than announced")
            self._mmap = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        self._bytes = torch.frombuffer(self._mmap, dtype=torch.uint8)

    @classmethod
    def create(cls, prefix: str, size: int) -> ShmBuffer:
        return cls(f"{prefix}-{os.getpid()}-{secrets.token_hex(6)}", size, create=True)

    def view(self, offset: int, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
        end = offset + nbytes(dtype, shape)
        if offset < 0 or end > self.size or offset % dtype.itemsize:
            raise ValueError(f"shared memory region [{offset}, {end}) is outside the segment")
        return self._bytes[offset:end].view(dtype).view(shape)

    @property
    def raw(self) -> mmap.mmap | None:
        """The mapping itself, for small byte headers (`executor.doorbell`)."""
        return self._mmap

    def write_token(self) -> bytes:
        token = secrets.token_bytes(TOKEN_BYTES)
        self._bytes[:TOKEN_BYTES].copy_(torch.frombuffer(bytearray(token), dtype=torch.uint8))
        return token

    def read_token(self) -> bytes:
        return bytes(self._bytes[:TOKEN_BYTES].numpy())

    def unlink(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(SHM_DIR / self.name)

    def close(self) -> None:
        """Drop this handle's references. The mapping itself goes when the last tensor viewing it
        does (torch keeps the mmap object alive): unmapping under a live view, say a queued
        call's rows when its worker dies, would crash the process."""
        self._bytes = torch.empty(0, dtype=torch.uint8)
        self._mmap = None

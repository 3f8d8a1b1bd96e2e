"""Shared memory between a worker and the executor: a file in /dev/shm, mapped by both.

The worker creates the segment and unlinks its name as soon as the executor has mapped it, so a
crash on either side never leaves a file behind; the memory goes when both mappings are gone.

The executor maps a segment only when nothing about it can point elsewhere: its name is one a
worker's segment can have (no path, no separator), it is opened relative to the shared-memory
directory with `O_NOFOLLOW` (no symbolic link), and it is a private regular file with a single
link, owned by the client's uid. Together with the token the client wrote into it, this keeps a
client from making the executor read or write any file but its own segment.
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import re
import secrets
import stat
from pathlib import Path

import torch

from wire.call.tensors import TOKEN_BYTES, nbytes
from wire.host import host

SHM_DIR = host().shm_dir
SEGMENT_PREFIX = "symbiosis"
SEGMENT_NAME = re.compile(rf"{SEGMENT_PREFIX}-[0-9]{{1,10}}-[0-9a-f]{{12}}")


class SegmentRefused(ValueError):
    """A client named something that is not a segment it may have made."""


class ShmBuffer:
    """A mapped segment exposed as one uint8 tensor; typed views are slices of it."""

    def __init__(self, name: str, size: int, fd: int, directory: Path) -> None:
        self.name = name
        self.size = size
        self.directory = directory
        self._mmap: mmap.mmap | None = mmap.mmap(fd, size)
        self._bytes = torch.frombuffer(self._mmap, dtype=torch.uint8)

    @classmethod
    def create(cls, size: int, directory: Path = SHM_DIR) -> ShmBuffer:
        """A fresh private segment of this process."""
        name = f"{SEGMENT_PREFIX}-{os.getpid()}-{secrets.token_hex(6)}"
        fd = os.open(directory / name, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            os.ftruncate(fd, size)
            return cls(name, size, fd, directory)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(directory / name)
            raise
        finally:
            os.close(fd)

    @classmethod
    def attach(cls, name: str, size: int, owner_uid: int,
               directory: Path = SHM_DIR) -> ShmBuffer:
        """Map a client's segment, refusing anything else (SegmentRefused, or OSError when it
        does not exist here: another host or IPC namespace)."""
        if not SEGMENT_NAME.fullmatch(name):
            raise SegmentRefused(f"{name!r} is not a segment name")
        if size <= TOKEN_BYTES:
            raise SegmentRefused(f"segment size {size} is too small")
        dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            fd = os.open(name, os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                         dir_fd=dir_fd)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise SegmentRefused(f"{name} is a symbolic link") from None
            raise
        finally:
            os.close(dir_fd)
        try:
            _check_private_file(name, os.fstat(fd), size, owner_uid)
            return cls(name, size, fd, directory)
        finally:
            os.close(fd)

    def view(self, offset: int, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
        end = offset + nbytes(dtype, shape)
        if offset < 0 or end > self.size or offset % dtype.itemsize:
            raise ValueError(f"shared memory region [{offset}, {end}) is outside the segment")
        return self._bytes[offset:end].view(dtype).view(shape)

    @property
    def raw(self) -> mmap.mmap | None:
        """The mapping itself, for small byte headers (`wire.call.doorbell`)."""
        return self._mmap

    def write_token(self) -> bytes:
        token = secrets.token_bytes(TOKEN_BYTES)
        self._bytes[:TOKEN_BYTES].copy_(torch.frombuffer(bytearray(token), dtype=torch.uint8))
        return token

    def read_token(self) -> bytes:
        return bytes(self._bytes[:TOKEN_BYTES].numpy())

    def unlink(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.directory / self.name)

    @property
    def bytes(self) -> torch.Tensor:
        """The whole mapping as one uint8 tensor (it keeps the mapping alive)."""
        return self._bytes

    def close(self) -> None:
        """Drop this handle's references. The mapping itself goes when the last tensor viewing it
        does (torch keeps the mmap object alive): unmapping under a live view, say a queued
        call's rows when its worker dies, would crash the process."""
        self._bytes = torch.empty(0, dtype=torch.uint8)
        self._mmap = None


def _check_private_file(name: str, st: os.stat_result, size: int, owner_uid: int) -> None:
    if not stat.S_ISREG(st.st_mode):
        raise SegmentRefused(f"{name} is not a regular file")
    if st.st_nlink != 1:
        raise SegmentRefused(f"{name} has {st.st_nlink} links")
    if st.st_uid != owner_uid:
        raise SegmentRefused(f"{name} is owned by uid {st.st_uid}, not the client's {owner_uid}")
    if st.st_mode & 0o077:
        raise SegmentRefused(f"{name} is readable or writable by others")
    if st.st_size < size:
        raise SegmentRefused(f"{name} is smaller than announced")

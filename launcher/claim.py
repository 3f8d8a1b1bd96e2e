"""One stack per data dir. A stack's sockets are keyed by its data dir (`Stack.run_dir`), so a
second `symbiosis serve` on the same one would bind the first's executor socket and, stopping,
remove the first's socket directory: its next worker or trainer would find no executor. The
claim is an exclusive `flock` on `stack.lock` in the data dir, held by the launcher's process
for as long as its stack runs (the kernel lets go of it if that process dies)."""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path

LOCK_FILE = "stack.lock"


class DataDirInUse(OSError):
    pass


def claim(data_dir: Path) -> int:
    """The claim's file descriptor (keep it open), or DataDirInUse naming the holder."""
    data_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(data_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise DataDirInUse(f"another symbiosis stack (pid {holder}) is serving the data dir "
                           f"{data_dir}: stop it first, or give this one its own "
                           "--data-dir") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def release(fd: int) -> None:
    with contextlib.suppress(OSError):
        os.close(fd)

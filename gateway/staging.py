"""An uploaded file streamed to a staging path in 1 MiB chunks by a worker thread: never held
in the gateway's memory whole, never written from the event loop."""

from __future__ import annotations

from pathlib import Path
from typing import BinaryIO

from fastapi import UploadFile
from starlette.concurrency import run_in_threadpool

from state.storage import write_new


async def stage(upload: UploadFile, target: Path, limit: int) -> bool:
    """`upload` copied to `target`; False if it holds more than `limit` bytes (then what was
    copied is there for the caller to remove)."""
    return await run_in_threadpool(copy_at_most, upload.file, target, limit) <= limit


def copy_at_most(source: BinaryIO, target: Path, limit: int) -> int:
    """Copy up to `limit` + 1 bytes in chunks (more means too large); the bytes copied."""
    return write_new(target, iter(lambda: source.read(min(1 << 20, limit + 1)), b""),
                     limit=limit + 1)

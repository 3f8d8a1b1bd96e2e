"""An uploaded file streamed to a staging path in 1 MiB chunks by a worker thread: never held
in the gateway's memory whole, never written from the event loop."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, BinaryIO

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


@asynccontextmanager
async def staging_file(state: Any, tenant: str) -> AsyncIterator[Path]:
    """A fresh staging path beside the files (`FileReader.staging`), within one of the tenant's
    upload slots; removed afterwards (by then the manager adopted it, or it is not wanted)."""
    async with state.uploads.slot(tenant):
        staged = state.files.staging()
        try:
            yield staged
        finally:
            staged.unlink(missing_ok=True)

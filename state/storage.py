"""Writing to the data directory when it may be full: what counts as out of space (the OS's
ENOSPC/EDQUOT, SQLite's "database or disk is full"), new files that never stay half-written,
deletes that free space first when the database itself has none, and how much is left."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import shutil
import sqlite3
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

from state.db import Database

SQLITE_FULL = 13
FILE_MODE, DIR_MODE = 0o600, 0o700
RESERVE_BYTES = 2**20


def out_of_space(exc: BaseException) -> bool:
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    return isinstance(exc, sqlite3.Error) and (
        getattr(exc, "sqlite_errorcode", None) == SQLITE_FULL or "disk is full" in str(exc))


def write_new(path: Path, data: bytes | Iterator[bytes], limit: int | None = None) -> int:
    """Write `path` whole (through a staging file of this call's own, renamed when complete,
    private to its owner) or not at all; the bytes written, stopping once past `limit` if one
    is given. Writers of one path at once (processes restoring the disk reserve) each rename a
    whole file of their own."""
    fd, name = tempfile.mkstemp(prefix=f"{path.name}.", suffix=".tmp", dir=path.parent)
    staging = Path(name)
    written = 0
    try:
        with os.fdopen(fd, "wb") as f:
            for chunk in [data] if isinstance(data, bytes) else data:
                f.write(chunk)
                written += len(chunk)
                if limit is not None and written >= limit:
                    break
        os.replace(staging, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(staging)
        raise
    return written


@contextlib.contextmanager
def staged_dir(target: Path) -> Iterator[Path]:
    """A directory filled under a staging name and renamed to `target` when the block ends;
    removed, with what it holds, when the block fails."""
    staging = target.with_name(target.name + ".tmp")
    staging.mkdir(mode=DIR_MODE)
    try:
        yield staging
        staging.rename(target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


class Reserve:
    """A file of zeros kept in the data directory, given up when a delete finds the disk so
    full that the database cannot even record it (SQLite needs room to delete), and taken
    back when there is room again."""

    def __init__(self, directory: Path, size: int = RESERVE_BYTES) -> None:
        self.path = directory / ".space-reserve"
        self.size = size

    def restore(self) -> bool:
        if self.path.exists() and self.path.stat().st_size >= self.size:
            return True
        try:
            write_new(self.path, bytes(self.size))
        except OSError as exc:
            if not out_of_space(exc):
                raise
            return False
        return True

    def release(self) -> None:
        self.path.unlink(missing_ok=True)


def delete_freeing_space(forget: Callable[[], None], remove: Callable[[], None],
                         reserve: Reserve) -> None:
    """`forget` the rows, then `remove` the files; when the database has no room even to
    forget, remove the files first and, if that is not room enough, give up the reserve."""
    for attempt in range(3):
        try:
            forget()
            break
        except (OSError, sqlite3.Error) as exc:
            if not out_of_space(exc) or attempt == 2:
                raise
            (remove if attempt == 0 else reserve.release)()
    remove()
    reserve.restore()


def delete_rows(db: Database, sql: str, params: tuple, reserve: Reserve) -> int:
    """The rows one DELETE (`sql`) selects deleted, on a full disk too (`delete_freeing_space`:
    the reserve given up for SQLite's room); how many."""
    count = 0

    def forget() -> None:
        nonlocal count
        with db.transaction() as conn:
            count = conn.execute(sql, params).rowcount

    delete_freeing_space(forget, lambda: None, reserve)
    return count


def file_sha256(path: Path | str) -> str:
    """The SHA-256 of a file's bytes, read in chunks (files can be as large as uploads)."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def private_files() -> None:
    """Files this process creates from now on are its user's alone (0600, directories 0700):
    the database, adapters, uploads and results are tenants' data."""
    os.umask(0o077)


def free_bytes(path: Path) -> int:
    return shutil.disk_usage(path).free

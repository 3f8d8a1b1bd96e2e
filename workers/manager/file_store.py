"""The worker manager's writes to uploaded files: adopt a staged upload or bytes as a file, delete
one (the data dir's one writer of the `files` table; `state.files` reads it)."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable
from pathlib import Path

from state.db import Database
from state.files import FileReader, FileRecord, new_id
from state.storage import Reserve, delete_freeing_space, write_new

Then = Callable[[sqlite3.Connection, FileRecord], None]


class FileStore(FileReader):
    def __init__(self, db: Database, data_dir: Path) -> None:
        super().__init__(db, data_dir)
        self.reserve = Reserve(data_dir)

    def create(self, tenant: str, filename: str, purpose: str, data: bytes | Path, *,
               examples: int = 0, format: str | None = None, expires_in: int | None = None,
               then: Then | None = None) -> FileRecord:
        """A new file from bytes, or adopting a staged file whole (`staging`); `expires_in`:
        seconds from now until it is gone for its tenant; `then`: what else its transaction
        writes (an upload it completes)."""
        file_id = new_id("file")
        path = self.root / file_id
        if isinstance(data, Path):
            size = data.stat().st_size
            data.rename(path)
        else:
            size = write_new(path, data)
        now = int(time.time())
        record = FileRecord(file_id, tenant, size, now, _safe_name(filename), purpose,
                            "processed", str(path), examples, format,
                            None if expires_in is None else now + expires_in)
        try:
            with self.db.transaction() as conn:
                conn.execute("INSERT INTO files VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                             (record.id, record.tenant, record.bytes, record.created_at,
                              record.filename, record.purpose, record.status, record.path,
                              record.examples, record.format, record.expires_at))
                if then is not None:
                    then(conn, record)
        except BaseException:
            path.unlink(missing_ok=True)
            raise
        return record

    def delete(self, record: FileRecord) -> None:
        def forget() -> None:
            with self.db.transaction() as conn:
                conn.execute("DELETE FROM files WHERE id = ?", (record.id,))

        delete_freeing_space(forget, lambda: Path(record.path).unlink(missing_ok=True),
                             self.reserve)



def _safe_name(filename: str) -> str:
    """Kept for display only: the last path component, printable, at most 255 characters."""
    name = filename.replace("\\", "/").rsplit("/", 1)[-1]
    return "".join(c for c in name if c.isprintable())[:255] or "upload"

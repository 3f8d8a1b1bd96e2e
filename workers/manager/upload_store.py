"""The worker manager's writes to uploads (`state.uploads` reads them): a pending upload made,
a staged part adopted, an upload finished (completed, cancelled or expired) with its parts
deleted, and ended ones forgotten an hour after their own."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

from state.db import Database
from state.files import new_id
from state.storage import Reserve, delete_freeing_space
from state.uploads import EXPIRES_S, PartRecord, UploadReader, UploadRecord


class UploadStore(UploadReader):
    def __init__(self, db: Database, data_dir: Path, reserve: Reserve) -> None:
        super().__init__(db, data_dir)
        self.reserve = reserve

    def create(self, tenant: str, filename: str, purpose: str, size: int, mime_type: str,
               file_expires_in: int | None) -> UploadRecord:
        now = int(time.time())
        record = UploadRecord(new_id("upload"), tenant, filename, purpose, size, mime_type, now,
                              now + EXPIRES_S, "pending", None, file_expires_in)
        with self.db.transaction() as conn:
            conn.execute("INSERT INTO uploads VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                         (record.id, record.tenant, record.filename, record.purpose,
                          record.bytes, record.mime_type, record.created_at, record.expires_at,
                          record.status, record.file_id, record.file_expires_in))
        return record

    def add_part(self, upload: UploadRecord, staged: Path) -> PartRecord:
        """The staged file adopted whole as the upload's next part."""
        part = PartRecord(new_id("part"), upload.id, upload.tenant, staged.stat().st_size,
                          int(time.time()))
        path = self.path(part.id)
        staged.rename(path)
        try:
            with self.db.transaction() as conn:
                conn.execute("INSERT INTO upload_parts VALUES (?, ?, ?, ?, ?)",
                             (part.id, part.upload, part.tenant, part.bytes, part.created_at))
        except BaseException:
            path.unlink(missing_ok=True)
            raise
        return part

    def finish(self, upload: UploadRecord, status: str) -> None:
        """`upload` ends as `status` (cancelled, expired); its parts' rows and bytes go."""
        parts = self.parts(upload.id)

        def forget() -> None:
            with self.db.transaction() as conn:
                self.ended(conn, upload.id, status)

        delete_freeing_space(forget, lambda: self.remove(parts), self.reserve)

    def ended(self, conn: sqlite3.Connection, upload_id: str, status: str,
              file_id: str | None = None) -> None:
        """In `conn`'s transaction: the upload ends as `status`, its parts' rows go (their bytes
        then: `remove`)."""
        conn.execute("DELETE FROM upload_parts WHERE upload = ?", (upload_id,))
        conn.execute("UPDATE uploads SET status = ?, file_id = ? WHERE id = ?",
                     (status, file_id, upload_id))

    def remove(self, parts: list[PartRecord]) -> None:
        for part in parts:
            self.path(part.id).unlink(missing_ok=True)

    def sweep(self) -> int:
        """Delete the part files no row names (a manager stopped between an upload's end and
        their removal); how many. Only the manager writes here, so at its start none is new."""
        named = {row["id"] for row in self.db.query("SELECT id FROM upload_parts")}
        gone = [path for path in self.parts_dir.iterdir()
                if path.name not in named and path.is_file()]
        for path in gone:
            path.unlink(missing_ok=True)
        return len(gone)

    def expire(self, now: int) -> list[str]:
        """The pending uploads past their hour end as expired (their parts deleted), and the
        records of those that ended are forgotten an hour after their hour; the expired ids."""
        gone = self.expired(now)
        for upload in gone:
            self.finish(upload, "expired")
        with self.db.transaction() as conn:
            conn.execute("DELETE FROM uploads WHERE status != 'pending' AND expires_at <= ?",
                         (now - EXPIRES_S,))
        return [upload.id for upload in gone]

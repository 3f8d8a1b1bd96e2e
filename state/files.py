"""Uploaded files: stored under DATA_DIR/files/<id> (client filenames are never paths)."""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass
from pathlib import Path

from state.db import Database
from state.storage import DIR_MODE, Reserve, delete_freeing_space, write_new

PURPOSES = {"fine-tune", "fine-tune-results"}


def new_id(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(12)}"


@dataclass(frozen=True)
class FileRecord:
    id: str
    tenant: str
    bytes: int
    created_at: int
    filename: str
    purpose: str
    status: str
    path: str
    examples: int = 0
    format: str | None = None

    def public(self) -> dict:
        return {"id": self.id, "object": "file", "bytes": self.bytes,
                "created_at": self.created_at, "filename": self.filename,
                "purpose": self.purpose, "status": self.status, "status_details": None}


class FileStore:
    def __init__(self, db: Database, data_dir: Path) -> None:
        self.db = db
        self.root = data_dir / "files"
        self.reserve = Reserve(data_dir)
        self.root.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)

    def staging(self) -> Path:
        """A fresh private path beside the files for an upload on its way in (`create` adopts
        it; the caller removes it otherwise)."""
        return self.root / f"{new_id('upload')}.tmp"

    def create(self, tenant: str, filename: str, purpose: str, data: bytes | Path, *,
               examples: int = 0, format: str | None = None) -> FileRecord:
        """A new file from bytes, or adopting a staged file whole (`staging`)."""
        file_id = new_id("file")
        path = self.root / file_id
        if isinstance(data, Path):
            size = data.stat().st_size
            data.rename(path)
        else:
            size = write_new(path, data)
        record = FileRecord(file_id, tenant, size, int(time.time()),
                            _safe_name(filename), purpose, "processed", str(path), examples,
                            format)
        try:
            with self.db.transaction() as conn:
                conn.execute("INSERT INTO files VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                             (record.id, record.tenant, record.bytes, record.created_at,
                              record.filename, record.purpose, record.status, record.path,
                              record.examples, record.format))
        except BaseException:
            path.unlink(missing_ok=True)
            raise
        return record

    def get(self, file_id: str, tenant: str) -> FileRecord | None:
        rows = self.db.query("SELECT * FROM files WHERE id = ? AND tenant = ?", (file_id, tenant))
        return FileRecord(**dict(rows[0])) if rows else None

    def list(self, tenant: str, *, purpose: str | None, after: str | None, limit: int,
             order: str) -> tuple[list[FileRecord], bool]:
        sql, params = "SELECT * FROM files WHERE tenant = ?", [tenant]
        if purpose:
            sql += " AND purpose = ?"
            params.append(purpose)
        direction = "DESC" if order == "desc" else "ASC"
        if after:
            cursor = self.get(after, tenant)
            if cursor is not None:
                op = "<" if order == "desc" else ">"
                sql += f" AND (created_at, id) {op} (?, ?)"
                params += [cursor.created_at, cursor.id]
        sql += f" ORDER BY created_at {direction}, id {direction} LIMIT ?"
        params.append(limit + 1)
        rows = [FileRecord(**dict(r)) for r in self.db.query(sql, tuple(params))]
        return rows[:limit], len(rows) > limit

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

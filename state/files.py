"""Uploaded files: stored under DATA_DIR/files/<id> (client filenames are never paths); read
here, written by the worker manager (`workers.manager.file_store`). An upload is staged beside
them (`FileReader.staging`) by the gateway, which then asks the manager to keep it."""

from __future__ import annotations

import re
import secrets
import time
from dataclasses import dataclass
from pathlib import Path

from state.db import Database, UnknownCursor
from state.storage import DIR_MODE

PURPOSES = {"fine-tune", "fine-tune-results", "batch", "batch_output"}
STAGED = re.compile(r"upload-[0-9a-f]{24}\.tmp")  # a staged upload's name, whole
UNEXPIRED = "(expires_at IS NULL OR expires_at > ?)"  # ? = now


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
    expires_at: int | None = None  # when it is gone for its tenant (None: never)

    def public(self) -> dict:
        return {"id": self.id, "object": "file", "bytes": self.bytes,
                "created_at": self.created_at, "expires_at": self.expires_at,
                "filename": self.filename, "purpose": self.purpose, "status": self.status,
                "status_details": None}


class FileReader:
    def __init__(self, db: Database, data_dir: Path) -> None:
        self.db = db
        self.root = data_dir / "files"
        self.root.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)

    def staging(self) -> Path:
        """A fresh private path beside the files for an upload on its way in (the manager's
        `FileStore.create` adopts it by name; the caller removes it otherwise)."""
        return self.root / f"{new_id('upload')}.tmp"

    def staged(self, name: str) -> Path | None:
        """The staged upload of this name, or None when the name is not one `staging` gives."""
        return self.root / name if STAGED.fullmatch(name) else None

    def get(self, file_id: str, tenant: str, *, expired: bool = False) -> FileRecord | None:
        """The tenant's file; one past its expiry only with `expired` (a job made before then
        still reads it)."""
        sql, params = "SELECT * FROM files WHERE id = ? AND tenant = ?", (file_id, tenant)
        if not expired:
            sql, params = sql + f" AND {UNEXPIRED}", (*params, int(time.time()))
        rows = self.db.query(sql, params)
        return FileRecord(**dict(rows[0])) if rows else None

    def expired(self, now: int) -> list[FileRecord]:
        rows = self.db.query("SELECT * FROM files WHERE expires_at <= ? ORDER BY expires_at",
                             (now,))
        return [FileRecord(**dict(r)) for r in rows]

    def list(self, tenant: str, *, purpose: str | None, after: str | None, limit: int,
             order: str) -> tuple[list[FileRecord], bool]:
        sql, params = f"SELECT * FROM files WHERE tenant = ? AND {UNEXPIRED}", \
            [tenant, int(time.time())]
        if purpose:
            sql += " AND purpose = ?"
            params.append(purpose)
        direction = "DESC" if order == "desc" else "ASC"
        if after:  # files of one second in the order they were made (rowid), not by id
            if self.get(after, tenant) is None:
                raise UnknownCursor(after)
            op = "<" if order == "desc" else ">"
            sql += f" AND (created_at, rowid) {op} (SELECT created_at, rowid FROM files " \
                "WHERE id = ?)"
            params.append(after)
        sql += f" ORDER BY created_at {direction}, rowid {direction} LIMIT ?"
        params.append(limit + 1)
        rows = [FileRecord(**dict(r)) for r in self.db.query(sql, tuple(params))]
        return rows[:limit], len(rows) > limit

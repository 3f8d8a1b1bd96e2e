"""Uploads: a file sent in parts (OpenAI's Uploads API), kept as its parts until completed into
one file (`state.files`) or cancelled, or for an hour (`EXPIRES_S`) at most. Read here, written
by the worker manager (`workers.manager.upload_store`). A part is stored under
DATA_DIR/files/parts/<id>, counted in its tenant's storage as files are (`state.kept_bytes`)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from state.db import Database
from state.storage import DIR_MODE

EXPIRES_S = 3600  # a pending upload's life
PURPOSES = ("fine-tune", "batch")  # what a file sent in parts may be for


@dataclass(frozen=True)
class UploadRecord:
    id: str
    tenant: str
    filename: str
    purpose: str
    bytes: int
    mime_type: str
    created_at: int
    expires_at: int
    status: str  # pending, completed, cancelled, expired (`status_now`: expired once past
    # `expires_at`, before the manager's sweep records it)
    file_id: str | None = None  # the file it became
    file_expires_in: int | None = None  # that file's `expires_after[seconds]`

    def status_now(self, now: int | None = None) -> str:
        late = self.expires_at <= (int(time.time()) if now is None else now)
        return "expired" if self.status == "pending" and late else self.status

    def public(self) -> dict:
        return {"id": self.id, "object": "upload", "bytes": self.bytes,
                "created_at": self.created_at, "expires_at": self.expires_at,
                "filename": self.filename, "purpose": self.purpose,
                "status": self.status_now()}


@dataclass(frozen=True)
class PartRecord:
    id: str
    upload: str
    tenant: str
    bytes: int
    created_at: int

    def public(self) -> dict:
        return {"id": self.id, "object": "upload.part", "created_at": self.created_at,
                "upload_id": self.upload}


class UploadReader:
    def __init__(self, db: Database, data_dir: Path) -> None:
        self.db = db
        self.parts_dir = data_dir / "files" / "parts"
        self.parts_dir.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)

    def get(self, upload_id: str, tenant: str) -> UploadRecord | None:
        rows = self.db.query("SELECT * FROM uploads WHERE id = ? AND tenant = ?",
                             (upload_id, tenant))
        return UploadRecord(**dict(rows[0])) if rows else None

    def parts(self, upload_id: str) -> list[PartRecord]:
        rows = self.db.query("SELECT * FROM upload_parts WHERE upload = ? ORDER BY created_at, id",
                             (upload_id,))
        return [PartRecord(**dict(r)) for r in rows]

    def part(self, part_id: str, upload_id: str) -> PartRecord | None:
        rows = self.db.query("SELECT * FROM upload_parts WHERE id = ? AND upload = ?",
                             (part_id, upload_id))
        return PartRecord(**dict(rows[0])) if rows else None

    def held(self, upload_id: str) -> int:
        """The bytes its parts hold so far."""
        return self.db.query("SELECT COALESCE(SUM(bytes), 0) AS n FROM upload_parts "
                             "WHERE upload = ?", (upload_id,))[0]["n"]

    def path(self, part_id: str) -> Path:
        """Where a part's bytes are (its id is ours: `new_id`, never a client's)."""
        return self.parts_dir / part_id

    def expired(self, now: int) -> list[UploadRecord]:
        rows = self.db.query("SELECT * FROM uploads WHERE status = 'pending' AND expires_at <= ?",
                             (now,))
        return [UploadRecord(**dict(r)) for r in rows]


def not_found(upload_id: str) -> str:
    return f"No such Upload object: {upload_id}"


def not_pending(upload: UploadRecord) -> str:
    return (f"Upload {upload.id} is {upload.status_now()}: only a pending upload takes parts, "
            "is completed or is cancelled.")


def parts_wrong(upload: UploadRecord, sizes: dict[str, int],
                part_ids: list[str]) -> tuple[int, str, str] | None:
    """Why `part_ids` cannot complete `upload` (its parts' `sizes`): (the HTTP status, code and
    message), or None if they can. Parts it does not hold, or not the bytes it was made for,
    are a 409: the request does not fit the upload as it is (the upload itself is there)."""
    unknown = [part for part in part_ids if part not in sizes]
    if unknown:
        return 409, "invalid_part_ids", (f"Not parts of upload {upload.id}: "
                                         f"{', '.join(unknown[:5])}.")
    if len(set(part_ids)) != len(part_ids):
        return 400, "invalid_part_ids", "A part is named more than once."
    total = sum(sizes[part] for part in part_ids)
    if total != upload.bytes:
        return 409, "upload_incomplete", (f"The parts hold {total} bytes; upload {upload.id} "
                                          f"was created for {upload.bytes}.")
    return None

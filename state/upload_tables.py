"""The tables of uploads (`state.uploads`) and their parts, whose bytes count in their tenant's
storage as files do (`state.kept_bytes`), as do an upload's own names (a tenant cannot keep
rows past its quota however many uploads it opens)."""

from __future__ import annotations

from state.kept_bytes import Counted, counting

PARTS = Counted("upload_parts", "files", ("bytes",), "{row}.tenant", measured=True)
UPLOADS = Counted("uploads", "files", ("id", "filename", "mime_type"), "{row}.tenant")
MIGRATION = f"""
    CREATE TABLE uploads (
        id TEXT PRIMARY KEY,
        tenant TEXT NOT NULL,
        filename TEXT NOT NULL,
        purpose TEXT NOT NULL,
        bytes INTEGER NOT NULL,
        mime_type TEXT NOT NULL,
        created_at INTEGER NOT NULL,
        expires_at INTEGER NOT NULL,
        status TEXT NOT NULL,
        file_id TEXT,
        file_expires_in INTEGER
    );
    CREATE INDEX uploads_by_expiry ON uploads (status, expires_at);
    CREATE TABLE upload_parts (
        id TEXT PRIMARY KEY,
        upload TEXT NOT NULL,
        tenant TEXT NOT NULL,
        bytes INTEGER NOT NULL,
        created_at INTEGER NOT NULL
    );
    CREATE INDEX upload_parts_by_upload ON upload_parts (upload);
    {counting(PARTS)}
    {counting(UPLOADS)}
    """

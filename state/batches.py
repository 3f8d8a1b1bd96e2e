"""Batches (the Batch API): a file of requests that the gateway runs in the background, each
line's result kept as it comes (so a gateway that restarts goes on where it was), then gathered
into an output and an error file. Read here, written by the worker manager
(`workers.manager.batch_store`)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from state.db import Database, after_cursor

BATCH_ID = re.compile(r"batch_[0-9a-f]{32}")
ACTIVE = ("in_progress", "cancelling")  # a gateway runs these
WINDOW_S = 24 * 3600  # completion_window "24h"
ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/embeddings")


@dataclass(frozen=True)
class BatchRecord:
    id: str
    tenant: str
    created_at: int
    body: dict[str, Any]  # the Batch object as returned
    output_expires_s: int | None = None  # its output and error files' lifetime (None: kept)

    @property
    def status(self) -> str:
        return self.body["status"]


class BatchReader:
    def __init__(self, db: Database) -> None:
        self.db = db

    def get(self, batch_id: str, tenant: str) -> BatchRecord | None:
        rows = self.db.query("SELECT * FROM batches WHERE id = ? AND tenant = ?",
                             (batch_id, tenant))
        return _record(rows[0]) if rows else None

    def list(self, tenant: str, *, after: str | None, limit: int) -> \
            tuple[list[BatchRecord], bool]:
        """A page of the tenant's batches, the newest first."""
        rows = [_record(r) for r in self.db.query(
            "SELECT * FROM batches WHERE tenant = ? ORDER BY created_at DESC, rowid DESC",
            (tenant,))]
        rows = after_cursor(rows, [r.id for r in rows], after)
        return rows[:limit], len(rows) > limit

    def active(self) -> list[BatchRecord]:
        """Every tenant's batches that are running or being cancelled, the oldest first."""
        return [_record(r) for r in self.db.query(
            f"SELECT * FROM batches WHERE status IN ({', '.join('?' * len(ACTIVE))}) "
            "ORDER BY created_at, rowid", ACTIVE)]

    def done_lines(self, batch_id: str) -> set[int]:
        """The input lines (0-based) whose results are kept."""
        return {row["line"] for row in self.db.query(
            "SELECT line FROM batch_results WHERE batch_id = ?", (batch_id,))}


def _record(row) -> BatchRecord:
    return BatchRecord(row["id"], row["tenant"], row["created_at"], json.loads(row["body"]),
                       row["output_expires_s"])

"""Batches, written: created for a tenant's input file, each line's result kept once (a gateway
that runs a line again after a restart changes nothing), cancelled, and finished by gathering
the results into an output file (the lines answered 2xx) and an error file (the others, and
those never run: cancelled or expired), in the input's order (`state.batches` reads them)."""

from __future__ import annotations

import json
import os
import secrets
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO

from state.batches import ACTIVE, BATCH_ID, ENDPOINTS, WINDOW_S, BatchReader, BatchRecord
from state.db import Database
from state.storage import FILE_MODE
from workers.manager.file_store import FileStore
from workers.manager.response_store import InvalidRecord

PAGE = 500  # kept answers read at a time by a finish
FINAL = {"completed": "completed_at", "cancelled": "cancelled_at", "expired": "expired_at"}
UNRUN = {"cancelled": ("batch_cancelled", "This request was not run: the batch was cancelled."),
         "expired": ("batch_expired", "This request could not be executed before the "
                     "completion window expired."),
         "completed": ("request_not_run", "This request was not run: its input file was gone.")}


class BatchStore(BatchReader):
    def __init__(self, db: Database, files: FileStore) -> None:
        super().__init__(db)
        self.files = files

    def add(self, tenant: str, record: str) -> str:
        """A batch (JSON: `id`, `endpoint`, `input_file_id`, `total`, `metadata`,
        `output_expires_s`) for the tenant's input file, running from now; its id."""
        made = _json(record)
        expires = made.get("output_expires_s")
        if not BATCH_ID.fullmatch(str(made.get("id"))) or made.get("endpoint") not in ENDPOINTS \
                or type(made.get("total")) is not int or made["total"] < 1 or \
                not isinstance(made.get("metadata") or {}, dict) or \
                not (expires is None or (type(expires) is int and expires > 0)):
            raise InvalidRecord("a batch record has an id batch_<32 hex>, an endpoint, its "
                                "number of requests, its metadata and its files' lifetime")
        source = self.files.get(str(made.get("input_file_id")), tenant)
        if source is None or source.purpose != "batch":
            raise InvalidRecord(f"no batch input file {made.get('input_file_id')!r}")
        now = int(time.time())
        body = {"id": made["id"], "object": "batch", "endpoint": made["endpoint"],
                "errors": None, "input_file_id": source.id, "completion_window": "24h",
                "status": "in_progress", "output_file_id": None, "error_file_id": None,
                "created_at": now, "in_progress_at": now, "expires_at": now + WINDOW_S,
                "finalizing_at": None, "completed_at": None, "failed_at": None,
                "expired_at": None, "cancelling_at": None, "cancelled_at": None,
                "request_counts": {"total": made["total"], "completed": 0, "failed": 0},
                "metadata": made.get("metadata") or None,
                "model": made.get("model") if isinstance(made.get("model"), str) else None,
                "usage": {"input_tokens": 0, "input_tokens_details": {"cached_tokens": 0},
                          "output_tokens": 0, "output_tokens_details": {"reasoning_tokens": 0},
                          "total_tokens": 0}}
        with self.db.transaction() as conn:
            conn.execute("INSERT INTO batches (id, tenant, created_at, body, status, "
                         "output_expires_s) VALUES (?, ?, ?, ?, ?, ?)",
                         (body["id"], tenant, now, json.dumps(body), body["status"], expires))
        return body["id"]

    def keep(self, tenant: str, record: str) -> bool:
        """One line's result (JSON: `batch_id`, `line`, `custom_id`, `response`) kept and
        counted; False if it was kept before or the batch is not running."""
        made = _json(record)
        response = made.get("response")
        if type(made.get("line")) is not int or not isinstance(made.get("custom_id"), str) or \
                not isinstance(response, dict) or type(response.get("status_code")) is not int:
            raise InvalidRecord("a batch result has its line, custom_id and response")
        batch = self.get(str(made.get("batch_id")), tenant)
        if batch is None or batch.status not in ACTIVE or \
                not 0 <= made["line"] < batch.body["request_counts"]["total"]:
            return False
        ok = 200 <= response["status_code"] < 300
        result = {"id": f"batch_req_{secrets.token_hex(16)}", "custom_id": made["custom_id"],
                  "response": response, "error": None}
        with self.db.transaction() as conn:
            if not conn.execute("INSERT OR IGNORE INTO batch_results (batch_id, line, ok, "
                                "result) VALUES (?, ?, ?, ?)",
                                (batch.id, made["line"], ok, json.dumps(result))).rowcount:
                return False
            counts = batch.body["request_counts"]
            counts["completed" if ok else "failed"] += 1
            _count_tokens(batch.body["usage"], response.get("body"))
            self._write(conn, batch)
        return True

    def cancel(self, tenant: str, batch_id: str) -> BatchRecord | None:
        """A running batch marked cancelling (its gateway stops and finishes it); None if the
        tenant has no such batch."""
        batch = self.get(batch_id, tenant)
        if batch is not None and batch.status == "in_progress":
            batch.body.update(status="cancelling", cancelling_at=int(time.time()))
            with self.db.transaction() as conn:
                self._write(conn, batch)
        return batch

    def finish(self, tenant: str, batch_id: str, status: str) -> BatchRecord | None:
        """A running batch ended as `status` (completed, cancelled or expired): its results
        gathered into its files; None if the tenant has no such batch."""
        batch = self.get(batch_id, tenant)
        if batch is None or batch.status not in ACTIVE or status not in FINAL:
            return batch
        kept = self._kept(batch.id)
        next_kept = next(kept, None)
        staged = {True: self.files.staging(), False: self.files.staging()}  # output, errors
        written = {True: 0, False: 0}
        try:
            with _private(staged[True]) as output, _private(staged[False]) as errors:
                for line, custom_id in enumerate(self._custom_ids(batch)):
                    ok, result = False, None
                    if next_kept is not None and next_kept[0] == line:
                        _, ok, result = next_kept
                        next_kept = next(kept, None)
                    if result is None:  # never run
                        code, message = UNRUN[status]
                        result = json.dumps({"id": f"batch_req_{secrets.token_hex(16)}",
                                             "custom_id": custom_id, "response": None,
                                             "error": {"code": code, "message": message}})
                    (output if ok else errors).write(result + "\n")
                    written[ok] += 1
            for ok, key, name in ((True, "output_file_id", "output"),
                                  (False, "error_file_id", "error")):
                if written[ok]:
                    batch.body[key] = self.files.create(
                        tenant, f"{batch.id}_{name}.jsonl", "batch_output", staged[ok],
                        examples=written[ok], expires_in=batch.output_expires_s).id
        finally:
            for path in staged.values():
                path.unlink(missing_ok=True)  # adopted ones are gone already
        now = int(time.time())
        batch.body.update({"status": status, "finalizing_at": now, FINAL[status]: now})
        with self.db.transaction() as conn:
            self._write(conn, batch)
            conn.execute("DELETE FROM batch_results WHERE batch_id = ?", (batch.id,))
        return batch

    def using_file(self, file_id: str, tenant: str) -> list[str]:
        """The tenant's running batches that read `file_id`."""
        return [b.id for b in self.active() if b.tenant == tenant and
                b.body["input_file_id"] == file_id]

    def _kept(self, batch_id: str) -> Iterator[tuple[int, bool, str]]:
        """Its kept answers in line order, `PAGE` read at a time (a finish never holds them
        all)."""
        after = -1
        while rows := self.db.query("SELECT line, ok, result FROM batch_results WHERE "
                                    "batch_id = ? AND line > ? ORDER BY line LIMIT ?",
                                    (batch_id, after, PAGE)):
            for row in rows:
                yield row["line"], bool(row["ok"]), row["result"]
            after = rows[-1]["line"]

    def _custom_ids(self, batch: BatchRecord) -> list[str]:
        source = self.files.get(batch.body["input_file_id"], batch.tenant, expired=True)
        total = batch.body["request_counts"]["total"]
        if source is None:
            return [""] * total
        with open(source.path, "rb") as f:
            ids = [str(json.loads(line).get("custom_id", "")) for line in f if line.strip()]
        return (ids + [""] * total)[:total]

    @staticmethod
    def _write(conn, batch: BatchRecord) -> None:
        conn.execute("UPDATE batches SET body = ?, status = ? WHERE id = ?",
                     (json.dumps(batch.body), batch.body["status"], batch.id))


def _private(path: Path) -> TextIO:
    """A new file only its owner reads, as every stored file is."""
    return os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC,
                             FILE_MODE), "w")


def _count_tokens(usage: dict[str, Any], answer: Any) -> None:
    """An answer's tokens added to the batch's (a completion's prompt and completion tokens,
    a response's input and output tokens)."""
    used = answer.get("usage") if isinstance(answer, dict) else None
    if not isinstance(used, dict):
        return
    for into, names in (("input_tokens", ("prompt_tokens", "input_tokens")),
                        ("output_tokens", ("completion_tokens", "output_tokens"))):
        tokens = next((used[n] for n in names if type(used.get(n)) is int), 0)
        usage[into] += tokens
        usage["total_tokens"] += tokens


def _json(record: str) -> dict[str, Any]:
    try:
        made = json.loads(record)
    except ValueError:
        raise InvalidRecord("a batch record is JSON") from None
    if not isinstance(made, dict):
        raise InvalidRecord("a batch record is a JSON object")
    return made

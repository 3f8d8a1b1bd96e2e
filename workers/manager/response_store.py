"""Stored responses, written: the gateway's record of a response it answered, kept for its
tenant until RETENTION_S after its creation (`state.responses` reads them)."""

from __future__ import annotations

import json
from typing import Any

from state.db import Database
from state.responses import PENDING, RESPONSE_ID, RETENTION_S, ResponseReader
from state.storage import Reserve, delete_freeing_space


class InvalidRecord(ValueError):
    pass


class ResponseStore(ResponseReader):
    def add(self, tenant: str, record: str) -> str:
        """The record (JSON: `id`, `created_at`, `body`, `conversation`, `own`; a background
        response's `request` too) kept; its id."""
        made = _checked(record)
        with self.db.transaction() as conn:
            conn.execute("INSERT INTO responses (id, tenant, created_at, expires_at, body, "
                         "conversation, own, status, request) VALUES (?, ?, ?, ?, ?, ?, ?, ?, "
                         "?)", (made["id"], tenant, made["created_at"],
                                made["created_at"] + RETENTION_S, json.dumps(made["body"]),
                                json.dumps(made["conversation"]), made["own"],
                                made["body"].get("status", "completed"),
                                json.dumps(made["request"]) if made.get("request") else None))
        return made["id"]

    def settle(self, tenant: str, body: str) -> str:
        """The tenant's background response as `body` (a Response's JSON) now has it, if it
        was still queued or in progress: its id if it was, else "" (one that ended stays as it
        ended, whoever settles it second: its run or a cancel)."""
        try:
            made = json.loads(body)
        except ValueError:
            raise InvalidRecord("a response is JSON") from None
        if not isinstance(made, dict) or not RESPONSE_ID.fullmatch(str(made.get("id"))) or \
                not isinstance(made.get("status"), str):
            raise InvalidRecord("a response has an id resp_<32 hex> and a status")
        with self.db.transaction() as conn:
            settled = conn.execute(
                f"UPDATE responses SET body = ?, status = ? WHERE id = ? AND tenant = ? AND "
                f"status IN ({', '.join('?' * len(PENDING))})",
                (body, made["status"], made["id"], tenant, *PENDING)).rowcount
        return made["id"] if settled else ""

    def __init__(self, db: Database, reserve: Reserve) -> None:
        super().__init__(db)
        self.reserve = reserve  # given up when a full disk leaves SQLite no room to delete

    def delete(self, response_id: str, tenant: str) -> bool:
        return self._deleted("DELETE FROM responses WHERE id = ? AND tenant = ?",
                             (response_id, tenant)) > 0

    def expire(self, now: int) -> int:
        """Those past their retention deleted; how many."""
        return self._deleted("DELETE FROM responses WHERE expires_at <= ?", (now,))

    def _deleted(self, sql: str, params: tuple) -> int:
        count = 0

        def forget() -> None:
            nonlocal count
            with self.db.transaction() as conn:
                count = conn.execute(sql, params).rowcount

        delete_freeing_space(forget, lambda: None, self.reserve)
        return count


def _checked(record: str) -> dict[str, Any]:
    try:
        made = json.loads(record)
    except ValueError:
        raise InvalidRecord("a response record is JSON") from None
    if not isinstance(made, dict) or not RESPONSE_ID.fullmatch(str(made.get("id"))) or \
            type(made.get("created_at")) is not int or not isinstance(made.get("body"), dict) \
            or not isinstance(made.get("conversation"), list) or \
            type(made.get("own")) is not int or not 0 <= made["own"] <= len(made["conversation"]) \
            or not isinstance(made.get("request") or {}, dict):
        raise InvalidRecord("a response record has an id resp_<32 hex>, created_at, a body, "
                            "its conversation and how many items of it were its own (a "
                            "background one its request, an object)")
    return made

"""Stored responses, written: the gateway's record of a response it answered, kept for its
tenant until RETENTION_S after its creation (`state.responses` reads them). One that went on
from a response still kept keeps its own items and a link; deleting or expiring a response
first writes its whole conversation into those linked to it, so that they go on as before."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable
from typing import Any

from state.db import Database
from state.responses import (
    EARLIER,
    PENDING,
    RESPONSE_ID,
    RETENTION_S,
    ResponseReader,
    conversation,
)
from state.storage import Reserve, delete_freeing_space


class InvalidRecord(ValueError):
    pass


class ResponseStore(ResponseReader):
    def add(self, tenant: str, record: str, fits: Callable[[int], None] = lambda size: None) \
            -> str:
        """The record (JSON: `id`, `created_at`, `body`, `conversation`, `own`, `previous`:
        the id it went on from or null; a background response's `request` too) kept; its id.
        `fits` is asked first for the bytes it takes (and refuses by raising)."""
        made = _checked(record)
        with self.db.transaction() as conn:
            previous = made.get("previous")
            if previous and not conn.execute("SELECT 1 FROM responses WHERE id = ? AND "
                                             "tenant = ?", (previous, tenant)).fetchone():
                previous = None  # deleted or expired meanwhile: kept whole
            kept = made["conversation"][len(made["conversation"]) - made["own"]:] \
                if previous else made["conversation"]
            row = (json.dumps(made["body"]), json.dumps(kept),
                   json.dumps(made["request"]) if made.get("request") else None)
            fits(sum(len(text.encode()) for text in row if text))
            conn.execute("INSERT INTO responses (id, tenant, created_at, expires_at, body, "
                         "conversation, request, own, status, previous) VALUES (?, ?, ?, ?, ?, "
                         "?, ?, ?, ?, ?)", (made["id"], tenant, made["created_at"],
                                            made["created_at"] + RETENTION_S, *row, made["own"],
                                            made["body"].get("status", "completed"), previous))
        return made["id"]

    def settle(self, tenant: str, body: str) -> str:
        """The tenant's background response as `body` (a Response's JSON) now has it, if it
        was still queued or in progress: its id if it was, else "" (one that ended stays as it
        ended, whoever settles it second: its run or a cancel)."""
        with self.db.transaction() as conn:
            return settled(conn, tenant, body)

    def __init__(self, db: Database, reserve: Reserve) -> None:
        super().__init__(db)
        self.reserve = reserve  # given up when a full disk leaves SQLite no room to delete

    def delete(self, response_id: str, tenant: str) -> bool:
        return self._deleted("SELECT id, tenant FROM responses WHERE id = ? AND tenant = ?",
                             (response_id, tenant)) > 0

    def expire(self, now: int) -> int:
        """Those past their retention deleted; how many."""
        return self._deleted("SELECT id, tenant FROM responses WHERE expires_at <= ? ORDER BY "
                             "created_at", (now,))

    def _deleted(self, sql: str, params: tuple) -> int:
        """The responses `sql` selects (id, tenant; predecessors first) deleted, each after
        its whole conversation went into those that went on from it; how many."""
        count = 0

        def forget() -> None:
            nonlocal count
            with self.db.transaction() as conn:
                gone = conn.execute(sql, params).fetchall()
                for response_id, tenant in gone:
                    _hand_on(conn, response_id, tenant)
                    conn.execute("DELETE FROM responses WHERE id = ?", (response_id,))
                count = len(gone)

        delete_freeing_space(forget, lambda: None, self.reserve)
        return count


def settled(conn: sqlite3.Connection, tenant: str, body: str) -> str:
    """`ResponseStore.settle` within a transaction of the caller's."""
    try:
        made = json.loads(body)
    except ValueError:
        raise InvalidRecord("a response is JSON") from None
    if not isinstance(made, dict) or not RESPONSE_ID.fullmatch(str(made.get("id"))) or \
            not isinstance(made.get("status"), str):
        raise InvalidRecord("a response has an id resp_<32 hex> and a status")
    return made["id"] if conn.execute(
        f"UPDATE responses SET body = ?, status = ? WHERE id = ? AND tenant = ? AND "
        f"status IN ({', '.join('?' * len(PENDING))})",
        (body, made["status"], made["id"], tenant, *PENDING)).rowcount else ""


def _hand_on(conn: sqlite3.Connection, response_id: str, tenant: str) -> None:
    """Those that went on from the response keep its whole conversation and output instead of
    their link to it."""
    followers = conn.execute("SELECT id, conversation FROM responses WHERE previous = ? AND "
                             "tenant = ?", (response_id, tenant)).fetchall()
    if not followers:
        return
    earlier = conversation(conn.execute(EARLIER, (response_id, tenant)).fetchall(), "[]")
    for follower, kept in followers:
        conn.execute("UPDATE responses SET conversation = ?, previous = NULL WHERE id = ?",
                     (json.dumps([*earlier, *json.loads(kept)]), follower))


def _checked(record: str) -> dict[str, Any]:
    try:
        made = json.loads(record)
    except ValueError:
        raise InvalidRecord("a response record is JSON") from None
    if not isinstance(made, dict) or not RESPONSE_ID.fullmatch(str(made.get("id"))) or \
            type(made.get("created_at")) is not int or not isinstance(made.get("body"), dict) \
            or not isinstance(made.get("conversation"), list) or \
            type(made.get("own")) is not int or not 0 <= made["own"] <= len(made["conversation"]) \
            or not isinstance(made.get("request") or {}, dict) or \
            not (made.get("previous") is None or RESPONSE_ID.fullmatch(str(made["previous"]))):
        raise InvalidRecord("a response record has an id resp_<32 hex>, created_at, a body, "
                            "its conversation and how many items of it were its own (a "
                            "background one its request, an object; one that went on from "
                            "another that one's id)")
    return made

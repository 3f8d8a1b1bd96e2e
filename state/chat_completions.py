"""Stored chat completions (a chat request's `store: true`): each with the messages it answered
and its metadata, to list (by model and metadata), read again, tag anew or delete. Kept
RETENTION_S after creation, as stored responses are; read here, written by the worker manager
(`workers.manager.chat_store`)."""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass
from typing import Any

from state.db import Database, UnknownCursor, page
from state.responses import RETENTION_S

CHAT_ID = re.compile(r"chatcmpl-[0-9a-f]{32}")
__all__ = ["CHAT_ID", "RETENTION_S", "ChatReader", "StoredChat"]


@dataclass(frozen=True)
class StoredChat:
    id: str
    tenant: str
    created_at: int
    model: str
    metadata: dict[str, str]
    body: dict[str, Any]  # the chat completion as answered
    messages: list[dict[str, Any]]  # the request's messages, each with its id

    def shown(self) -> dict[str, Any]:
        """The completion as read back: as answered, with its metadata."""
        return {**self.body, "metadata": self.metadata}

    def messages_page(self, *, after: str | None, limit: int, order: str) -> \
            tuple[list[dict[str, Any]], bool]:
        """A page of its messages (`order` "asc": as sent; "desc": last first)."""
        return page(self.messages, after=after, limit=limit, order=order)


class ChatReader:
    def __init__(self, db: Database) -> None:
        self.db = db

    def get(self, chat_id: str, tenant: str) -> StoredChat | None:
        """The tenant's stored completion, until it expires."""
        rows = self.db.query("SELECT * FROM chat_completions WHERE id = ? AND tenant = ? AND "
                             "expires_at > ?", (chat_id, tenant, int(time.time())))
        return _stored(rows[0]) if rows else None

    def list(self, tenant: str, *, model: str | None, metadata: dict[str, str],
             after: str | None, limit: int, order: str) -> tuple[list[StoredChat], bool]:
        """A page of the tenant's stored completions of `model` (any without) whose metadata
        holds every pair of `metadata`, by creation (`order` "asc": the oldest first), past
        the one `after` names (UnknownCursor if that is none of the tenant's)."""
        now = int(time.time())
        where, params = ["tenant = ?", "expires_at > ?"], [tenant, now]
        if model is not None:
            where.append("model = ?")
            params.append(model)
        for key, value in metadata.items():
            where.append("EXISTS (SELECT 1 FROM json_each(chat_completions.metadata) "
                         "WHERE json_each.key = ? AND json_each.value = ?)")
            params += [key, value]
        ahead = ">" if order == "asc" else "<"
        if after:
            cursor = self.db.query("SELECT created_at, rowid FROM chat_completions WHERE "
                                   "id = ? AND tenant = ? AND expires_at > ?",
                                   (after, tenant, now))
            if not cursor:
                raise UnknownCursor(after)
            where.append(f"(created_at, rowid) {ahead} (?, ?)")
            params += [cursor[0]["created_at"], cursor[0]["rowid"]]
        direction = "ASC" if order == "asc" else "DESC"
        rows = self.db.query(f"SELECT * FROM chat_completions WHERE {' AND '.join(where)} "
                             f"ORDER BY created_at {direction}, rowid {direction} LIMIT ?",
                             (*params, limit + 1))
        return [_stored(row) for row in rows[:limit]], len(rows) > limit


def _stored(row: Any) -> StoredChat:
    return StoredChat(row["id"], row["tenant"], row["created_at"], row["model"],
                      json.loads(row["metadata"]), json.loads(row["body"]),
                      json.loads(row["messages"]))

"""Stored chat completions, written: the gateway's record of a chat completion it answered with
`store: true`, kept for its tenant until RETENTION_S after its creation
(`state.chat_completions` reads them); its metadata may be set anew."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from state.chat_completions import CHAT_ID, RETENTION_S, ChatReader
from state.storage import Reserve, delete_rows
from wire.store import METADATA_RULE, metadata_ok
from workers.manager.response_store import InvalidRecord


class ChatStore(ChatReader):
    def __init__(self, db, reserve: Reserve) -> None:
        super().__init__(db)
        self.reserve = reserve  # given up when a full disk leaves SQLite no room to delete

    def add(self, tenant: str, record: str, fits: Callable[[int], None] = lambda size: None) \
            -> str:
        """The record (JSON: `body`, a chat completion with its `id`, `created` and `model`;
        `messages`, each with an `id`; `metadata`) kept; its id. `fits` is asked first for
        the bytes it takes (and refuses by raising)."""
        made = _checked(record)
        body = made["body"]
        row = (json.dumps(made["metadata"]), json.dumps(body), json.dumps(made["messages"]))
        fits(sum(len(text.encode()) for text in row))
        with self.db.transaction() as conn:
            conn.execute("INSERT INTO chat_completions (id, tenant, created_at, expires_at, "
                         "model, metadata, body, messages) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                         (body["id"], tenant, body["created"], body["created"] + RETENTION_S,
                          body["model"], *row))
        return body["id"]

    def tag(self, tenant: str, record: str) -> bool:
        """The tenant's stored completion (JSON: `id`, `metadata`) has that metadata now;
        whether there was one to tag."""
        try:
            made = json.loads(record)
        except ValueError:
            raise InvalidRecord("a chat completion's metadata is JSON") from None
        if not isinstance(made, dict) or not CHAT_ID.fullmatch(str(made.get("id"))) or \
                not metadata_ok(made.get("metadata")):
            raise InvalidRecord("new metadata names a chat completion (chatcmpl-<32 hex>) and "
                                f"holds {METADATA_RULE}")
        with self.db.transaction() as conn:
            return conn.execute("UPDATE chat_completions SET metadata = ? WHERE id = ? AND "
                                "tenant = ?", (json.dumps(made["metadata"]), made["id"],
                                               tenant)).rowcount > 0

    def delete(self, chat_id: str, tenant: str) -> bool:
        return delete_rows(self.db, "DELETE FROM chat_completions WHERE id = ? AND tenant = ?",
                           (chat_id, tenant), self.reserve) > 0

    def expire(self, now: int) -> int:
        """Those past their retention deleted; how many."""
        return delete_rows(self.db, "DELETE FROM chat_completions WHERE expires_at <= ?", (now,),
                           self.reserve)


def _checked(record: str) -> dict[str, Any]:
    try:
        made = json.loads(record)
    except ValueError:
        raise InvalidRecord("a chat completion record is JSON") from None
    body = made.get("body") if isinstance(made, dict) else None
    messages = made.get("messages") if isinstance(made, dict) else None
    if not isinstance(body, dict) or not CHAT_ID.fullmatch(str(body.get("id"))) or \
            type(body.get("created")) is not int or not isinstance(body.get("model"), str) or \
            not isinstance(messages, list) or not all(
                isinstance(m, dict) and isinstance(m.get("id"), str) for m in messages) or \
            not metadata_ok(made.get("metadata")):
        raise InvalidRecord("a chat completion record has its body (an id chatcmpl-<32 hex>, "
                            "created, model), its messages, each with an id, and metadata: "
                            f"{METADATA_RULE}")
    return made

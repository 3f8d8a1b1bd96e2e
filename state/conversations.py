"""Conversations (OpenAI's Conversations API): a tenant's lasting list of items (messages,
function calls and their outputs) that responses read before their input and add their input
and output to. Kept until deleted (no retention, as OpenAI's); read here, written by the worker
manager (`workers.manager.conversation_store`)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from state.db import Database, UnknownCursor
from state.usage import CONVERSATION_BYTES

CONVERSATION_ID = re.compile(r"conv_[0-9a-f]{32}")


@dataclass(frozen=True)
class StoredConversation:
    id: str
    tenant: str
    created_at: int
    metadata: dict[str, str]

    def shown(self) -> dict[str, Any]:
        return {"id": self.id, "object": "conversation", "created_at": self.created_at,
                "metadata": self.metadata}


class ConversationReader:
    def __init__(self, db: Database) -> None:
        self.db = db

    def get(self, conversation_id: str, tenant: str) -> StoredConversation | None:
        rows = self.db.query("SELECT * FROM conversations WHERE id = ? AND tenant = ?",
                             (conversation_id, tenant))
        if not rows:
            return None
        row = rows[0]
        return StoredConversation(row["id"], row["tenant"], row["created_at"],
                                  json.loads(row["metadata"]))

    def listed(self, tenant: str, limit: int) -> list[dict[str, Any]]:
        """The tenant's newest conversations, each with how many items it has and the bytes
        it keeps (its metadata and items, as its storage quota counts them)."""
        return [{"id": row["id"], "created_at": row["created_at"],
                 "metadata": json.loads(row["metadata"]), "items": row["items"],
                 "bytes": row["bytes"]} for row in self.db.query(
            "SELECT c.id, c.created_at, c.metadata, (SELECT COUNT(*) FROM conversation_items i "
            f"WHERE i.conversation = c.id) AS items, {CONVERSATION_BYTES} AS bytes FROM "
            "conversations c WHERE c.tenant = ? ORDER BY c.created_at DESC, c.rowid DESC "
            "LIMIT ?", (tenant, limit))]

    def items(self, conversation_id: str, tenant: str) -> list[dict[str, Any]]:
        """Every item of the tenant's conversation, the first first (none if there is no such
        conversation)."""
        return [json.loads(row["item"]) for row in self.db.query(
            "SELECT i.item FROM conversation_items i JOIN conversations c ON "
            "c.id = i.conversation WHERE c.id = ? AND c.tenant = ? ORDER BY i.seq",
            (conversation_id, tenant))]

    def found_item(self, tenant: str, item_id: str) -> dict[str, Any] | None:
        """The item of that id in any of the tenant's conversations (the newest there)."""
        rows = self.db.query(
            "SELECT i.item FROM conversation_items i JOIN conversations c ON "
            "c.id = i.conversation WHERE i.id = ? AND c.tenant = ? ORDER BY c.created_at DESC "
            "LIMIT 1", (item_id, tenant))
        return json.loads(rows[0]["item"]) if rows else None

    def item(self, conversation_id: str, tenant: str, item_id: str) -> dict[str, Any] | None:
        rows = self.db.query(
            "SELECT i.item FROM conversation_items i JOIN conversations c ON "
            "c.id = i.conversation WHERE c.id = ? AND c.tenant = ? AND i.id = ?",
            (conversation_id, tenant, item_id))
        return json.loads(rows[0]["item"]) if rows else None

    def page(self, conversation_id: str, tenant: str, *, after: str | None, limit: int,
             order: str) -> tuple[list[dict[str, Any]], bool]:
        """A page of the conversation's items (`order` "asc": the first first; "desc": the
        last first) past the one `after` names (UnknownCursor if that is none of its)."""
        where, params = "i.conversation = ?", [conversation_id]
        ahead = ">" if order == "asc" else "<"
        if after:
            cursor = self.db.query("SELECT seq FROM conversation_items WHERE conversation = ? "
                                   "AND id = ?", (conversation_id, after))
            if not cursor:
                raise UnknownCursor(after)
            where += f" AND i.seq {ahead} ?"
            params.append(cursor[0]["seq"])
        direction = "ASC" if order == "asc" else "DESC"
        rows = self.db.query(
            "SELECT i.item FROM conversation_items i JOIN conversations c ON "
            f"c.id = i.conversation WHERE c.tenant = ? AND {where} ORDER BY i.seq {direction} "
            "LIMIT ?", (tenant, *params, limit + 1))
        return [json.loads(row["item"]) for row in rows[:limit]], len(rows) > limit

"""Conversations, written: a tenant's conversation (its metadata and items), the items added at
its end (by the items endpoint and by each response that goes on in it), an item deleted, the
whole deleted (`state.conversations` reads them); a background response settled with its turn
in one transaction (a cancel that settles it first leaves the conversation as it was). Items
arrive with their ids, made by the gateway."""

from __future__ import annotations

import json
import re
import sqlite3
from collections.abc import Callable
from typing import Any

from state.conversations import CONVERSATION_ID, ConversationReader
from state.storage import Reserve, delete_rows
from wire.store import METADATA_RULE, metadata_ok
from workers.manager.response_store import InvalidRecord, settled

ITEM_ID = re.compile(r"(msg|fc|fco)_[0-9a-f]{32}")
ITEM_TYPES = ("message", "function_call", "function_call_output")
Fits = Callable[[int], None]
Room = Callable[[int], bool]


class ConversationStore(ConversationReader):
    def __init__(self, db, reserve: Reserve) -> None:
        super().__init__(db)
        self.reserve = reserve  # given up when a full disk leaves SQLite no room to delete

    def add(self, tenant: str, record: str, fits: Fits = lambda size: None) -> str:
        """The conversation (JSON: `id`, `created_at`, `metadata`, `items`) kept; its id.
        `fits` is asked first for the bytes it takes (and refuses by raising)."""
        made = _json(record, "a conversation")
        if not CONVERSATION_ID.fullmatch(str(made.get("id"))) or \
                type(made.get("created_at")) is not int or not metadata_ok(made.get("metadata")):
            raise InvalidRecord("a conversation has an id conv_<32 hex>, created_at and "
                                f"metadata: {METADATA_RULE}")
        items = _items(made.get("items"))
        metadata = json.dumps(made["metadata"])
        fits(len(metadata.encode()) + sum(len(text.encode()) for _, text in items))
        with self.db.transaction() as conn:
            conn.execute("INSERT INTO conversations (id, tenant, created_at, metadata) VALUES "
                         "(?, ?, ?, ?)", (made["id"], tenant, made["created_at"], metadata))
            _append(conn, made["id"], items)
        return made["id"]

    def extend(self, tenant: str, record: str, fits: Fits = lambda size: None) -> bool:
        """The items of the record (JSON: `conversation`, `items`) added at the end of the
        tenant's conversation; whether there was one."""
        made = _json(record, "items for a conversation")
        items = _items(made.get("items"))
        with self.db.transaction() as conn:
            if not _owned(conn, made.get("conversation"), tenant):
                return False
            fits(sum(len(text.encode()) for _, text in items))
            _append(conn, made["conversation"], items)
        return True

    def settle_turn(self, tenant: str, record: str, room: Room = lambda size: True) -> \
            tuple[str, bool]:
        """A background response's end (JSON: `response`, as `ResponseStore.settle` takes it;
        `conversation`; `items`, its turn): the response settled if it was still pending, and
        then, in the same transaction, its turn added at the end of the tenant's conversation
        unless there is none or `room` refuses its bytes. Its id ("" where it had ended before:
        then nothing is added) and whether the turn was added."""
        made = _json(record, "a response's turn")
        items = _items(made.get("items"))
        with self.db.transaction() as conn:
            response_id = settled(conn, tenant, json.dumps(made.get("response")))
            if not response_id or not _owned(conn, made.get("conversation"), tenant) or \
                    not room(sum(len(text.encode()) for _, text in items)):
                return response_id, False
            _append(conn, made["conversation"], items)
        return response_id, True

    def tag(self, tenant: str, record: str) -> bool:
        """The tenant's conversation (JSON: `id`, `metadata`) has that metadata now; whether
        there was one to tag."""
        made = _json(record, "a conversation's metadata")
        if not metadata_ok(made.get("metadata")):
            raise InvalidRecord(f"a conversation's metadata holds {METADATA_RULE}")
        with self.db.transaction() as conn:
            return conn.execute("UPDATE conversations SET metadata = ? WHERE id = ? AND "
                                "tenant = ?", (json.dumps(made["metadata"]), str(made.get("id")),
                                               tenant)).rowcount > 0

    def delete(self, conversation_id: str, tenant: str) -> bool:
        """The tenant's conversation with its items; whether there was one."""
        return delete_rows(self.db, "DELETE FROM conversations WHERE id = ? AND tenant = ?",
                           (conversation_id, tenant), self.reserve) > 0

    def delete_item(self, tenant: str, record: str) -> bool | None:
        """The item the record (JSON: `conversation`, `item`) names deleted; None if there is
        no such conversation of the tenant's, False if it has no such item."""
        made = _json(record, "an item to delete")
        with self.db.transaction() as conn:
            if not _owned(conn, made.get("conversation"), tenant):
                return None
        return delete_rows(self.db, "DELETE FROM conversation_items WHERE conversation = ? AND "
                           "id = ?", (made["conversation"], str(made.get("item"))),
                           self.reserve) > 0


def _owned(conn: sqlite3.Connection, conversation_id: object, tenant: str) -> bool:
    return conn.execute("SELECT 1 FROM conversations WHERE id = ? AND tenant = ?",
                        (str(conversation_id), tenant)).fetchone() is not None


def _append(conn: sqlite3.Connection, conversation_id: str, items: list[tuple[str, str]]) \
        -> None:
    last, = conn.execute("SELECT COALESCE(MAX(seq), -1) FROM conversation_items WHERE "
                         "conversation = ?", (conversation_id,)).fetchone()
    conn.executemany("INSERT INTO conversation_items (conversation, seq, id, item) VALUES "
                     "(?, ?, ?, ?)", [(conversation_id, last + 1 + k, item_id, text)
                                      for k, (item_id, text) in enumerate(items)])


def _json(record: str, what: str) -> dict[str, Any]:
    try:
        made = json.loads(record)
    except ValueError:
        made = None
    if not isinstance(made, dict):
        raise InvalidRecord(f"{what} is a JSON object")
    return made


def _items(items: object) -> list[tuple[str, str]]:
    """Each item's id and JSON; InvalidRecord unless each is an object of a known type with
    an id made here, and no id comes twice."""
    if not isinstance(items, list) or not all(
            isinstance(item, dict) and item.get("type") in ITEM_TYPES and
            ITEM_ID.fullmatch(str(item.get("id"))) for item in items) or \
            len({item["id"] for item in items}) < len(items):
        raise InvalidRecord("a conversation's items are objects (message, function_call or "
                            "function_call_output), each with its own id (msg_, fc_ or fco_ "
                            "and 32 hex)")
    return [(item["id"], json.dumps(item)) for item in items]

"""Stored responses (the Responses API's `store`): each with the conversation it answered, so
that a later request can go on from it (`previous_response_id`) and a client can read it again.
Kept RETENTION_S after creation, as OpenAI keeps them; read here, written by the worker manager
(`workers.manager.response_store`). A background response (`background: true`) is kept from
its creation, `queued`, with its request, until the gateway that runs it settles it.

A response that went on from a stored one keeps only its request's own items and a link to that
one (`previous`), so a conversation of N turns takes N turns' room, not N^2: its whole
conversation is read back along the links. A response that starts a conversation (or whose
predecessor was gone when it was kept, or was deleted or expired since) keeps it whole."""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass
from typing import Any

from state.db import Database, page
from state.response_items import KEEPER
from state.usage import RESPONSE_BYTES

RETENTION_S = 30 * 24 * 3600
RESPONSE_ID = re.compile(r"resp_[0-9a-f]{32}")
PENDING = ("queued", "in_progress")  # a background response's states before it settles


@dataclass(frozen=True)
class StoredResponse:
    id: str
    tenant: str
    created_at: int
    expires_at: int
    body: dict[str, Any]  # the Response object as returned
    conversation: list[dict[str, Any]]  # the items it answered, its request's own last
    own: int  # how many of them its request sent (the rest: from previous_response_id)
    request: dict[str, Any] | None = None  # a background response's request, to run again
    whole: bool = True  # False: `conversation` is only what its row keeps (its own items last)

    @property
    def pending(self) -> bool:
        return self.body["status"] in PENDING

    @property
    def input_items(self) -> list[dict[str, Any]]:
        return self.conversation[len(self.conversation) - self.own:]

    def continued(self) -> list[dict[str, Any]]:
        """The conversation a request that goes on from this response continues: what it
        answered, then its output."""
        if not self.whole:
            raise ValueError(f"{self.id} was read without the turns it went on from")
        return [*self.conversation, *self.body["output"]]

    def items(self, *, after: str | None, limit: int, order: str) -> \
            tuple[list[dict[str, Any]], bool]:
        """A page of its input items (`order` "asc": as sent; "desc": last first)."""
        return page(self.input_items, after=after, limit=limit, order=order)


class ResponseReader:
    def __init__(self, db: Database) -> None:
        self.db = db

    def get(self, response_id: str, tenant: str, *, earlier: bool = True) -> \
            StoredResponse | None:
        """The tenant's response, until it expires; without `earlier`, not read along its
        links (its body and input items need only its own row)."""
        rows = self.db.query("SELECT * FROM responses WHERE id = ? AND tenant = ? AND "
                             "expires_at > ?", (response_id, tenant, int(time.time())))
        return self._stored(rows[0], earlier) if rows else None

    def found_item(self, tenant: str, item_id: str) -> dict[str, Any] | None:
        """The item of that id among the input and output items the tenant's responses keep,
        until they expire (the newest response's that keeps one, found by the index)."""
        for row in self.db.query(KEEPER, (tenant, item_id, int(time.time()))):
            for item in [*json.loads(row["conversation"]),
                         *json.loads(row["body"]).get("output", [])]:
                if isinstance(item, dict) and item.get("id") == item_id:
                    return item
        return None

    def listed(self, tenant: str, limit: int) -> list[dict[str, Any]]:
        """The tenant's newest unexpired responses: id, creation, status and the bytes each
        keeps (as its storage quota counts them)."""
        return [dict(row) for row in self.db.query(
            f"SELECT id, created_at, status, {RESPONSE_BYTES} AS bytes FROM responses WHERE "
            "tenant = ? AND expires_at > ? ORDER BY created_at DESC, rowid DESC LIMIT ?",
            (tenant, int(time.time()), limit))]

    def pending(self) -> list[StoredResponse]:
        """The background responses not yet settled, every tenant's, oldest first."""
        rows = self.db.query(
            f"SELECT * FROM responses WHERE status IN ({', '.join('?' * len(PENDING))}) AND "
            "request IS NOT NULL AND expires_at > ? ORDER BY created_at",
            (*PENDING, int(time.time())))
        return [self._stored(row) for row in rows]

    def _stored(self, row: Any, whole: bool = True) -> StoredResponse:
        earlier = self.db.query(EARLIER, (row["previous"], row["tenant"])) \
            if row["previous"] and whole else []
        return StoredResponse(row["id"], row["tenant"], row["created_at"], row["expires_at"],
                              json.loads(row["body"]), conversation(earlier, row["conversation"]),
                              row["own"], json.loads(row["request"]) if row["request"] else None,
                              whole)


# a response's predecessors along their links, the first of the conversation first
EARLIER = """
    WITH RECURSIVE chain(id, previous, conversation, body, depth) AS (
        SELECT id, previous, conversation, body, 0 FROM responses WHERE id = ?1 AND tenant = ?2
        UNION ALL
        SELECT r.id, r.previous, r.conversation, r.body, chain.depth + 1
        FROM responses r JOIN chain ON r.id = chain.previous AND r.tenant = ?2)
    SELECT conversation, body FROM chain ORDER BY depth DESC"""


def conversation(earlier: list[Any], kept: str) -> list[dict[str, Any]]:
    """The whole conversation a response answered: each predecessor's kept items and output in
    turn (`earlier`: rows of `conversation` and `body`, the first first), then its own kept."""
    items: list[dict[str, Any]] = []
    for row in earlier:
        items += json.loads(row["conversation"])
        items += json.loads(row["body"])["output"]
    return items + json.loads(kept)

"""Conversations at the manager's desk, with its real stores on a data dir: a conversation is
kept with its metadata and first items, items are added at its end in order, read a page at a
time either way past a cursor, deleted one by one or with the conversation; each tenant's
alone, counted in its storage quota; a malformed record, or one sent again, is refused with
nothing kept. A background response's end settles it and adds its turn in one transaction: a
cancel that settled it first leaves the conversation as it was; a conversation gone or full
leaves the response settled, its turn not added."""

from __future__ import annotations

import json
import time

import pytest

from state.db import UnknownCursor
from state.usage import stored_bytes
from tests.workers.manager.test_response_store import ID, body_of, queued
from tests.workers.manager.test_store_desk import act, records
from wire.store import StoreAction

__all__ = ["records"]  # the fixture
CONV = f"conv_{'c' * 32}"


def message(n: int) -> dict:
    return {"type": "message", "id": f"msg_{n:032x}", "role": "user", "status": "completed",
            "content": [{"type": "input_text", "text": f"turn {n}"}]}


def create(records, tenant: str = "acme", items: list | None = None, quota: int = 0,
           conversation: str = CONV):
    return act(records, StoreAction.ADD_CONVERSATION, tenant, quota_bytes=quota,
               record=json.dumps({"id": conversation, "created_at": int(time.time()),
                                  "metadata": {"topic": "t"}, "items": items or []}))


def extend(records, items: list, tenant: str = "acme", quota: int = 0):
    return act(records, StoreAction.ADD_ITEMS, tenant, quota_bytes=quota,
               record=json.dumps({"conversation": CONV, "items": items}))


def ids(items: list[dict]) -> list[str]:
    return [item["id"] for item in items]


def test_items_are_kept_in_order_and_paged_either_way(records) -> None:
    assert create(records, items=[message(0), message(1)]).made == CONV
    assert extend(records, [message(2)]).ok and extend(records, [message(3), message(4)]).ok
    every = [message(n) for n in range(5)]
    assert records.conversations.items(CONV, "acme") == every
    page = records.conversations.page
    assert page(CONV, "acme", after=None, limit=2, order="asc") == (every[:2], True)
    assert page(CONV, "acme", after=every[1]["id"], limit=3, order="asc") == (every[2:], False)
    assert page(CONV, "acme", after=every[3]["id"], limit=2, order="desc") == \
        ([every[2], every[1]], True)
    with pytest.raises(UnknownCursor):
        page(CONV, "acme", after="msg_nothing", limit=2, order="asc")
    assert records.conversations.item(CONV, "acme", every[3]["id"]) == every[3]
    assert records.conversations.get(CONV, "acme").shown() == {
        "id": CONV, "object": "conversation", "created_at": pytest.approx(time.time(), abs=5),
        "metadata": {"topic": "t"}}


def test_a_conversation_is_its_tenants_alone(records) -> None:
    create(records, items=[message(0)])
    assert extend(records, [message(1)], tenant="beta").status == 404
    assert act(records, StoreAction.TAG_CONVERSATION, "beta",
               record=json.dumps({"id": CONV, "metadata": {}})).status == 404
    assert act(records, StoreAction.DELETE_ITEM, "beta",
               record=json.dumps({"conversation": CONV, "item": message(0)["id"]})).status == 404
    assert act(records, StoreAction.DELETE_CONVERSATION, "beta", response_id=CONV).status == 404
    assert records.conversations.get(CONV, "beta") is None
    assert records.conversations.items(CONV, "beta") == []
    assert records.conversations.page(CONV, "beta", after=None, limit=5, order="asc") == \
        ([], False)
    assert records.conversations.items(CONV, "acme") == [message(0)]


def test_an_item_or_the_whole_is_deleted(records) -> None:
    create(records, items=[message(0), message(1), message(2)])
    gone = act(records, StoreAction.DELETE_ITEM, record=json.dumps(
        {"conversation": CONV, "item": message(1)["id"]}))
    assert gone.deleted == [message(1)["id"]]
    again = act(records, StoreAction.DELETE_ITEM, record=json.dumps(
        {"conversation": CONV, "item": message(1)["id"]}))
    assert (again.status, again.code) == (404, "item_not_found")
    assert extend(records, [message(1)]).ok  # its id is free again; it comes last
    assert ids(records.conversations.items(CONV, "acme")) == ids([message(n) for n in (0, 2, 1)])
    assert act(records, StoreAction.DELETE_CONVERSATION, response_id=CONV).deleted == [CONV]
    assert records.db.query("SELECT COUNT(*) FROM conversation_items")[0][0] == 0


def test_the_quota_counts_its_metadata_and_items(records, tmp_path) -> None:
    create(records, items=[message(0)])
    used = stored_bytes(records.db, "acme")
    assert used == len(json.dumps({"topic": "t"})) + len(json.dumps(message(0)))
    refused = extend(records, [message(1)], quota=used + 10)
    assert (refused.status, refused.code) == (403, "storage_quota_exceeded")
    assert extend(records, [message(1)], quota=2 * used).ok
    gone = act(records, StoreAction.ADD_ITEMS, quota_bytes=1, record=json.dumps(
        {"conversation": f"conv_{'e' * 32}", "items": [message(7)]}))
    assert gone.status == 404  # no such conversation: said before any quota
    other = create(records, "acme", quota=used, conversation=f"conv_{'d' * 32}")
    assert other.status == 403 and records.conversations.get(f"conv_{'d' * 32}", "acme") is None


@pytest.mark.parametrize(("action", "record"), [
    (StoreAction.ADD_CONVERSATION, "not json"),
    (StoreAction.ADD_CONVERSATION, json.dumps({"id": "conv_1", "created_at": 1, "metadata": {},
                                               "items": []})),
    (StoreAction.ADD_CONVERSATION, json.dumps({"id": CONV, "created_at": 1,
                                               "metadata": {"k": 1}, "items": []})),
    (StoreAction.ADD_CONVERSATION, json.dumps({"id": CONV, "created_at": 1, "metadata": {},
                                               "items": [{"type": "message"}]})),
    (StoreAction.ADD_ITEMS, json.dumps({"conversation": CONV, "items": [message(0), message(0)]})),
    (StoreAction.ADD_ITEMS, json.dumps({"conversation": CONV,
                                        "items": [{**message(5), "type": "reasoning"}]})),
    (StoreAction.ADD_ITEMS, json.dumps({"conversation": CONV, "items": [7]})),
    (StoreAction.TAG_CONVERSATION, json.dumps({"id": CONV, "metadata": None})),
    (StoreAction.DELETE_ITEM, json.dumps([CONV])),
    (StoreAction.SETTLE_TURN, json.dumps({"response": {"id": ID}, "conversation": CONV,
                                          "items": [message(8)]})),
    (StoreAction.SETTLE_TURN, json.dumps({"response": body_of(ID, "completed"),
                                          "conversation": CONV, "items": [7]})),
])
def test_a_malformed_record_is_refused_with_nothing_kept(records, action, record) -> None:
    create(records, items=[message(0)], conversation=CONV)
    answer = act(records, action, record=record)
    assert (answer.status, answer.code) == (400, "invalid_record"), answer.message
    assert records.conversations.items(CONV, "acme") == [message(0)]
    assert records.conversations.get(CONV, "acme").metadata == {"topic": "t"}


def test_a_command_sent_again_is_a_409_with_nothing_changed(records) -> None:
    create(records, items=[message(0)])
    for again in (create(records, items=[message(5)]), extend(records, [message(0)]),
                  extend(records, [message(6), message(0)])):
        assert (again.status, again.code) == (409, "already_exists")
    assert records.conversations.items(CONV, "acme") == [message(0)]


def ended(records, response_id: str = ID, conversation: str = CONV, quota: int = 0,
          tenant: str = "acme"):
    """The background response `response_id` completed with its turn (messages 8 and 9)."""
    return act(records, StoreAction.SETTLE_TURN, tenant, quota_bytes=quota, record=json.dumps(
        {"response": body_of(response_id, "completed"), "conversation": conversation,
         "items": [message(8), message(9)]}))


def test_a_background_response_settles_with_its_turn_or_not_at_all(records) -> None:
    create(records, items=[message(0)])
    queued(records)
    theirs = ended(records, tenant="beta")  # not beta's response
    assert (theirs.made, theirs.added) == ("", False)
    done = ended(records)
    assert (done.made, done.added) == (ID, True)
    assert records.responses.get(ID, "acme").body["status"] == "completed"
    assert records.conversations.items(CONV, "acme") == [message(n) for n in (0, 8, 9)]
    again = ended(records)  # it had ended: nothing changes
    assert (again.made, again.added) == ("", False)
    cancelled = f"resp_{'a' * 32}"
    queued(records, cancelled)
    assert act(records, StoreAction.SETTLE_RESPONSE, record=json.dumps(
        body_of(cancelled, "cancelled"))).made == cancelled
    late = ended(records, cancelled)
    assert (late.ok, late.made, late.added) == (True, "", False)
    assert records.responses.get(cancelled, "acme").body["status"] == "cancelled"
    assert len(records.conversations.items(CONV, "acme")) == 3


def test_a_turn_its_conversation_cannot_take_leaves_the_response_settled(records) -> None:
    create(records, items=[message(0)])
    used = stored_bytes(records.db, "acme")
    gone, full = f"resp_{'a' * 32}", f"resp_{'b' * 32}"
    for response_id in (gone, full):
        queued(records, response_id)
    nowhere = ended(records, gone, conversation=f"conv_{'e' * 32}")
    past_quota = ended(records, full, quota=used + 1)
    assert [(a.made, a.added) for a in (nowhere, past_quota)] == [(gone, False), (full, False)]
    assert records.responses.pending() == []
    assert records.conversations.items(CONV, "acme") == [message(0)]

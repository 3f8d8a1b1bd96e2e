"""Stored chat completions at the manager's desk, with its real stores on a data dir: kept with
their messages and metadata, listed by creation (either way, a page at a time past a cursor)
and filtered by model and metadata pairs; tagged anew, deleted, expired; each tenant's alone,
counted in its storage quota; a malformed record, or one sent again, is refused with nothing
kept."""

from __future__ import annotations

import json
import time

import pytest

from state.chat_completions import RETENTION_S
from state.db import UnknownCursor
from state.usage import stored_bytes
from tests.workers.manager.test_store_desk import act, records
from wire.store import StoreAction

__all__ = ["records"]  # the fixture
NOW = int(time.time())


def chat_id(n: int) -> str:
    return f"chatcmpl-{n:032x}"


def record(n: int, model: str = "tiny-llama", metadata: dict | None = None,
           created: int = NOW) -> dict:
    body = {"id": chat_id(n), "object": "chat.completion", "created": created, "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": f"answer {n}"},
                         "finish_reason": "stop"}]}
    messages = [{"id": f"{chat_id(n)}-{i}", "role": role, "content": f"{role} {n}",
                 "content_parts": None} for i, role in enumerate(("system", "user"))]
    return {"body": body, "messages": messages, "metadata": metadata or {}}


def keep(records, n: int, tenant: str = "acme", quota: int = 0, **fields):
    return act(records, StoreAction.ADD_CHAT, tenant, record=json.dumps(record(n, **fields)),
               quota_bytes=quota)


def listed(records, tenant: str = "acme", *, model: str | None = None,
           metadata: dict | None = None, after: str | None = None, limit: int = 20,
           order: str = "asc") -> tuple[list[str], bool]:
    found, more = records.chats.list(tenant, model=model, metadata=metadata or {}, after=after,
                                     limit=limit, order=order)
    return [chat.id for chat in found], more


def test_a_kept_completion_reads_back_with_its_messages_and_metadata(records) -> None:
    assert keep(records, 1, metadata={"topic": "greeting"}).made == chat_id(1)
    made = records.chats.get(chat_id(1), "acme")
    kept = record(1, metadata={"topic": "greeting"})
    assert made.shown() == {**kept["body"], "metadata": {"topic": "greeting"}}
    assert made.messages == kept["messages"]
    assert made.messages_page(after=None, limit=1, order="desc") == ([kept["messages"][1]], True)
    assert made.messages_page(after=f"{chat_id(1)}-1", limit=5, order="desc") == \
        ([kept["messages"][0]], False)
    with pytest.raises(UnknownCursor):
        made.messages_page(after="chatcmpl-x-9", limit=5, order="asc")
    assert records.chats.get(chat_id(1), "beta") is None
    assert stored_bytes(records.db, "acme") == sum(
        len(json.dumps(part)) for part in (kept["metadata"], kept["body"], kept["messages"]))


def test_listed_by_creation_a_page_at_a_time_and_filtered(records) -> None:
    for n, created in enumerate((NOW - 30, NOW - 20, NOW - 20, NOW - 10)):
        keep(records, n, created=created, model="acme/bot" if n % 2 else "tiny-llama",
             metadata={"n": str(n), "even": str(n % 2 == 0), 'odd "key"': "x"})
    keep(records, 9, tenant="beta")
    everything = [chat_id(n) for n in range(4)]
    assert listed(records) == (everything, False)
    assert listed(records, order="desc") == (everything[::-1], False)
    assert listed(records, limit=2) == (everything[:2], True)
    # 1 and 2 were made in the same second: the one kept first is listed first
    assert listed(records, after=chat_id(1), limit=1) == ([chat_id(2)], True)
    assert listed(records, after=chat_id(2), order="desc") == (everything[:2][::-1], False)
    assert listed(records, model="acme/bot") == ([chat_id(1), chat_id(3)], False)
    assert listed(records, metadata={"even": "True"}) == ([chat_id(0), chat_id(2)], False)
    assert listed(records, metadata={"even": "True", "n": "2"}) == ([chat_id(2)], False)
    assert listed(records, metadata={'odd "key"': "x", "n": "3"}) == ([chat_id(3)], False)
    assert listed(records, metadata={"n": "9"}) == ([], False)
    assert listed(records, "beta") == ([chat_id(9)], False)
    with pytest.raises(UnknownCursor):  # another tenant's is no cursor here
        listed(records, after=chat_id(9))


def test_tagged_anew_deleted_and_expired_each_for_its_tenant_alone(records) -> None:
    keep(records, 1, metadata={"a": "b"})
    keep(records, 2, created=NOW - RETENTION_S - 1)
    assert records.chats.get(chat_id(2), "acme") is None  # past its retention: gone already
    tag = json.dumps({"id": chat_id(1), "metadata": {"c": "d"}})
    assert act(records, StoreAction.TAG_CHAT, "beta", record=tag).status == 404
    assert act(records, StoreAction.TAG_CHAT, record=tag).ok
    assert records.chats.get(chat_id(1), "acme").metadata == {"c": "d"}
    bad = json.dumps({"id": chat_id(1), "metadata": {"c": 5}})
    assert act(records, StoreAction.TAG_CHAT, record=bad).status == 400
    assert act(records, StoreAction.DELETE_CHAT, "beta", response_id=chat_id(1)).status == 404
    assert records.chats.expire(NOW) == 1  # the one past its retention
    assert act(records, StoreAction.DELETE_CHAT, response_id=chat_id(1)).deleted == [chat_id(1)]
    assert act(records, StoreAction.DELETE_CHAT, response_id=chat_id(1)).status == 404
    assert records.db.query("SELECT COUNT(*) FROM chat_completions")[0][0] == 0


def test_a_completion_past_the_quota_malformed_or_again_is_refused_nothing_kept(records) -> None:
    refused = keep(records, 1, quota=100)
    assert (refused.status, refused.code) == (403, "storage_quota_exceeded")
    assert "chat completion" in refused.message
    for bad in ({**record(2), "metadata": {"k": 1}},
                {**record(3), "messages": [{"role": "user", "content": "no id"}]},
                {**record(4), "body": {**record(4)["body"], "id": "chatcmpl-../../x"}}):
        answer = act(records, StoreAction.ADD_CHAT, record=json.dumps(bad))
        assert (answer.status, answer.code) == (400, "invalid_record")
    assert act(records, StoreAction.ADD_CHAT, record="not json").status == 400
    assert listed(records) == ([], False)
    assert keep(records, 5, metadata={"n": "1"}).ok
    again = keep(records, 5, metadata={"n": "2"})  # a command sent again
    assert (again.status, again.code) == (409, "already_exists")
    assert records.chats.get(chat_id(5), "acme").metadata == {"n": "1"}

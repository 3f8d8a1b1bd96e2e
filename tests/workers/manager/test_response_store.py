"""Background responses at the manager's desk, with its real stores on a data dir: one kept
queued with its request is pending (listed to run again) until settled; settling replaces it
only while it is queued or in progress, so whichever of its run and a cancel comes second
changes nothing; only the tenant's own is settled; responses stored before the status column
have theirs from their body."""

from __future__ import annotations

import json
import time

import pytest

from openapi.responses import Response
from state.db import Database, db_path
from state.migrations import MIGRATIONS
from state.usage import stored_bytes
from tests.workers.manager.test_store_desk import act, records
from wire.store import StoreAction

__all__ = ["records"]  # the fixture
ID = f"resp_{'e' * 32}"
REQUEST = {"model": "tiny-llama", "input": "Hi", "background": True}
CREATED = int(time.time())
MESSAGE = {"type": "message", "id": "msg_9", "role": "assistant", "status": "completed",
           "content": [{"type": "output_text", "text": "Hello", "annotations": []}]}


def body_of(response_id: str, status: str, output: list | None = None) -> dict:
    return Response(id=response_id, created_at=CREATED, status=status, model="tiny-llama",
                    output=output or [], background=True, store=True).model_dump()


def queued(records, response_id: str = ID, tenant: str = "acme",
           request: dict | None = None) -> None:
    body = body_of(response_id, "queued")
    record = {"id": response_id, "created_at": CREATED, "body": body, "own": 1,
              "conversation": [{"type": "message", "id": "msg_1", "role": "user",
                                "content": "Hi"}], "request": request or REQUEST}
    assert act(records, StoreAction.ADD_RESPONSE, tenant, record=json.dumps(record)).ok


def settle(records, status: str, tenant: str = "acme", response_id: str = ID):
    body = body_of(response_id, status, [MESSAGE] if status == "completed" else [])
    return act(records, StoreAction.SETTLE_RESPONSE, tenant, record=json.dumps(body))


def test_a_queued_response_is_pending_until_it_settles_once(records) -> None:
    queued(records)
    pending, = records.responses.pending()
    assert (pending.id, pending.tenant, pending.request, pending.pending) == \
        (ID, "acme", REQUEST, True)
    assert stored_bytes(records.db, "acme") == sum(
        len(json.dumps(part)) for part in (pending.body, pending.conversation, REQUEST))
    assert settle(records, "in_progress").made == ID
    assert records.responses.get(ID, "acme").body["status"] == "in_progress"
    assert [r.id for r in records.responses.pending()] == [ID]
    assert settle(records, "completed").made == ID
    done = records.responses.get(ID, "acme")
    assert done.body == body_of(ID, "completed", [MESSAGE]) and not done.pending
    assert done.input_items[0]["id"] == "msg_1"  # its conversation as it was queued
    assert records.responses.pending() == []
    late = settle(records, "cancelled")  # a cancel after it completed: nothing changes
    assert late.ok and late.made == ""
    assert records.responses.get(ID, "acme").body["status"] == "completed"


def test_a_cancelled_response_is_not_completed_by_its_run(records) -> None:
    queued(records)
    assert settle(records, "cancelled").made == ID
    assert settle(records, "completed").made == ""
    assert records.responses.get(ID, "acme").body["output"] == []
    assert records.responses.pending() == []


def test_only_the_tenants_own_response_is_settled(records) -> None:
    queued(records)
    assert settle(records, "cancelled", tenant="beta").made == ""
    assert records.responses.get(ID, "acme").pending
    other = f"resp_{'f' * 32}"
    assert settle(records, "completed", response_id=other).made == ""  # none such
    assert records.responses.get(other, "acme") is None


@pytest.mark.parametrize("body", ["not json", json.dumps([1]), json.dumps({"id": "resp_1",
                                  "status": "completed"}), json.dumps({"id": ID})])
def test_a_malformed_settlement_is_refused(records, body: str) -> None:
    queued(records)
    answer = act(records, StoreAction.SETTLE_RESPONSE, record=body)
    assert (answer.status, answer.code) == (400, "invalid_record")
    assert records.responses.get(ID, "acme").body["status"] == "queued"


def test_responses_kept_before_the_status_column_have_their_bodys(tmp_path) -> None:
    before = Database(db_path(tmp_path), MIGRATIONS[:9])
    with before.transaction() as conn:
        conn.execute("INSERT INTO responses VALUES (?, 'acme', 1, ?, ?, '[]', 0)",
                     (ID, int(time.time()) + 60, json.dumps({"id": ID, "status": "incomplete"})))
    before.close()
    after = Database(db_path(tmp_path))
    assert tuple(after.query("SELECT status, request FROM responses")[0]) == ("incomplete", None)
    after.close()

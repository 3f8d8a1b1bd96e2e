"""Keeping a response (the gateway's side, with the manager's real records behind it): kept
with its conversation (a link to the response it went on from), its own items given ids; when
the manager cannot keep it, the request still has its answer, which then says it was not
stored."""

from __future__ import annotations

import pytest

from gateway.stored import keep
from gateway.tenants import Tenant
from openapi.items import FunctionCallOutputItem, MessageItem
from tests.gateway.conftest import KEY
from tests.workers.manager.test_response_store import body_of

ID, FIRST = f"resp_{'d' * 32}", f"resp_{'e' * 32}"


def made(response_id: str = ID, output: list | None = None) -> dict:
    return {"id": response_id, "created_at": 1_900_000_000, "output": output or [],
            "store": True}


def test_a_response_is_kept_with_its_conversation_and_its_own_items(managed) -> None:
    client, _ = managed
    keeping = client.app.state.manager, Tenant("acme")
    answer = {"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
              "content": [{"type": "output_text", "text": "Hi", "annotations": []}]}
    assert client.portal.call(keep, *keeping, made(FIRST, [answer]), None,
                              [MessageItem(role="user", content="Hi")])
    first = client.app.state.responses.get(FIRST, "acme")
    own = [MessageItem(role="assistant", content="Hello"),
           FunctionCallOutputItem(type="function_call_output", call_id="c1", output="sunny")]
    assert client.portal.call(keep, *keeping, made(), first, own)
    stored = client.app.state.responses.get(ID, "acme")
    assert stored.body == made() and stored.conversation[:2] == first.continued()
    assert first.continued()[0]["content"] == [{"type": "input_text", "text": "Hi"}]
    message, output = stored.input_items
    assert stored.conversation == [*first.continued(), message, output]
    assert message["content"] == [{"type": "output_text", "text": "Hello", "annotations": []}]
    assert message["id"].startswith("msg_") and output["id"].startswith("fco_")
    assert message["status"] == output["status"] == "completed"
    assert client.app.state.responses.get(ID, "beta") is None
    assert client.app.state.responses.db.query(  # kept as its own items and a link
        "SELECT previous FROM responses WHERE id = ?", (ID,))[0][0] == FIRST


def test_a_response_the_manager_cannot_keep_is_not_the_requests_failure(unmanaged) -> None:
    manager = unmanaged.app.state.manager
    assert unmanaged.portal.call(keep, manager, Tenant("acme"), made(), None, []) is False


def test_reading_a_response_and_its_input_items_reads_no_earlier_turn(managed) -> None:
    """GET and input items need only the response's own row: they answer as the response read
    whole does (its items as kept: no part's field added as null), and still do when the turns
    it went on from are unreadable (a long chain's reading is not paid for them)."""
    client, manager = managed
    keeping = client.app.state.manager, Tenant("acme")
    assert client.portal.call(keep, *keeping, made(FIRST), None,
                              [MessageItem(role="user", content="Hi")])
    first = client.app.state.responses.get(FIRST, "acme")
    own = [MessageItem(role="user", content=f"turn {n}") for n in range(3)]
    assert client.portal.call(keep, *keeping, body_of(ID, "completed"), first, own)
    whole = client.app.state.responses.get(ID, "acme")
    with manager.records.db.transaction() as conn:
        conn.execute("UPDATE responses SET body = '{}' WHERE id = ?", (FIRST,))  # no output
    for _ in range(2):
        body = client.get(f"/v1/responses/{ID}", headers=KEY)
        items = client.get(f"/v1/responses/{ID}/input_items?order=asc", headers=KEY)
        assert body.status_code == items.status_code == 200, (body.text, items.text)
        assert body.json() == whole.body
        assert items.json()["data"] == whole.input_items and len(whole.input_items) == 3
    kept = client.app.state.responses.get(ID, "acme", earlier=False)
    assert kept.input_items == whole.input_items and not kept.whole
    with pytest.raises(ValueError, match="without the turns"):
        kept.continued()

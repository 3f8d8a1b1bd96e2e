"""Keeping a response (the gateway's side, with the manager's real records behind it): kept
with its conversation, its own items given ids; when the manager cannot keep it, the request
still has its answer, which then says it was not stored."""

from __future__ import annotations

from gateway.stored import keep
from gateway.tenants import Tenant
from openapi.responses import FunctionCallOutputItem, MessageItem

ID = f"resp_{'d' * 32}"
EARLIER = [{"type": "message", "id": "msg_0", "role": "user", "status": "completed",
            "content": [{"type": "input_text", "text": "Hi"}]}]


def made() -> dict:
    return {"id": ID, "created_at": 1_900_000_000, "output": [], "store": True}


def test_a_response_is_kept_with_its_conversation_and_its_own_items(managed) -> None:
    client, _ = managed
    own = [MessageItem(role="assistant", content="Hello"),
           FunctionCallOutputItem(type="function_call_output", call_id="c1", output="sunny")]
    assert client.portal.call(keep, client.app.state.manager, Tenant("acme"), made(), EARLIER,
                              own)
    stored = client.app.state.responses.get(ID, "acme")
    assert stored.body == made() and stored.conversation[0] == EARLIER[0]
    message, output = stored.input_items
    assert message["content"] == [{"type": "output_text", "text": "Hello"}]
    assert message["id"].startswith("msg_") and output["id"].startswith("fco_")
    assert message["status"] == output["status"] == "completed"
    assert client.app.state.responses.get(ID, "beta") is None


def test_a_response_the_manager_cannot_keep_is_not_the_requests_failure(unmanaged) -> None:
    manager = unmanaged.app.state.manager
    assert unmanaged.portal.call(keep, manager, Tenant("acme"), made(), [], []) is False

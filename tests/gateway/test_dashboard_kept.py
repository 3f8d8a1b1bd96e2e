"""The dashboard's view of what a tenant keeps, with the manager's real records behind the
gateway: bytes by kind summing to what its storage quota counts, its conversations, the newest
first, each with its item count and size, and its stored responses with theirs; another
tenant's are not there."""

from __future__ import annotations

import json

from gateway.stored import keep
from gateway.tenants import Tenant
from openapi.items import MessageItem
from tests.gateway.conftest import KEY
from tests.gateway.test_stored import ID, made

BETA = {"Authorization": "Bearer sk-beta"}


def test_a_tenant_sees_its_conversations_newest_first_with_their_sizes(managed) -> None:
    client, _ = managed
    talks = []
    for n in range(2):
        items = [{"role": "user", "content": f"Turn {k}."} for k in range(n + 1)]
        talks.append(client.post("/v1/conversations", headers=KEY,
                                 json={"items": items, "metadata": {"n": str(n)}}).json())
    client.post("/v1/conversations", headers=BETA, json={})
    kept = client.get("/dashboard/api/kept", headers=KEY).json()
    sizes = [len(json.dumps({"n": str(n)})) + sum(
        len(json.dumps(item)) for item in client.app.state.conversations.items(talk["id"], "acme"))
        for n, talk in enumerate(talks)]
    assert kept["conversations"] == [
        {"id": talk["id"], "created_at": talk["created_at"], "metadata": {"n": str(n)},
         "items": n + 1, "bytes": sizes[n]} for n, talk in reversed(list(enumerate(talks)))]
    assert kept["bytes"] == {"files": 0, "adapters": 0, "responses": 0, "chat_completions": 0,
                             "conversations": sum(sizes), "batch_answers": 0}
    assert client.get("/dashboard/api/usage", headers=KEY).json()["storage"]["used_bytes"] == \
        sum(sizes)
    assert [c["items"] for c in client.get("/dashboard/api/kept", headers=BETA).json()[
        "conversations"]] == [0]


def test_a_tenant_sees_its_stored_responses_with_their_sizes(managed) -> None:
    client, _ = managed
    assert client.portal.call(keep, client.app.state.manager, Tenant("acme"), made(),
                              None, [MessageItem(role="user", content="Hi")])
    kept = client.app.state.responses.get(ID, "acme")
    size = len(json.dumps(kept.body)) + len(json.dumps(kept.conversation))
    listed = client.get("/dashboard/api/kept", headers=KEY).json()
    assert listed["responses"] == [{"id": ID, "created_at": kept.created_at,
                                    "status": "completed", "bytes": size}]
    assert listed["bytes"]["responses"] == size
    assert client.get("/dashboard/api/kept", headers=BETA).json()["responses"] == []

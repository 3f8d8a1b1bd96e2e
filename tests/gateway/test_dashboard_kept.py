"""The dashboard's view of what a tenant keeps, with the manager's real records behind the
gateway: bytes by kind summing to what its storage quota counts, and its conversations, the
newest first, each with its item count and size; another tenant's are not there."""

from __future__ import annotations

import json

from tests.gateway.conftest import KEY

BETA = {"Authorization": "Bearer sk-beta"}


def test_a_tenant_sees_its_conversations_newest_first_with_their_sizes(managed) -> None:
    client, _ = managed
    made = []
    for n in range(2):
        items = [{"role": "user", "content": f"Turn {k}."} for k in range(n + 1)]
        made.append(client.post("/v1/conversations", headers=KEY,
                                 json={"items": items, "metadata": {"n": str(n)}}).json())
    client.post("/v1/conversations", headers=BETA, json={})
    kept = client.get("/dashboard/api/kept", headers=KEY).json()
    sizes = [len(json.dumps({"n": str(n)})) + sum(
        len(json.dumps(item)) for item in client.app.state.conversations.items(talk["id"], "acme"))
        for n, talk in enumerate(made)]
    assert kept["conversations"] == [
        {"id": talk["id"], "created_at": talk["created_at"], "metadata": {"n": str(n)},
         "items": n + 1, "bytes": sizes[n]} for n, talk in reversed(list(enumerate(made)))]
    assert kept["bytes"] == {"files": 0, "adapters": 0, "responses": 0, "chat_completions": 0,
                             "conversations": sum(sizes), "batch_answers": 0}
    assert client.get("/dashboard/api/usage", headers=KEY).json()["storage"]["used_bytes"] == \
        sum(sizes)
    assert [c["items"] for c in client.get("/dashboard/api/kept", headers=BETA).json()[
        "conversations"]] == [0]

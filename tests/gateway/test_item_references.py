"""Items given by reference, with the manager's real records behind the gateway (in a
response's input, and in the items a conversation is made with or given): each is replaced by
the item of that id from what the request goes on from, else from the tenant's conversations,
else from its stored responses; another tenant's item, or none, is a 404 naming the reference's
place (`input[i]`, `items[i]`); items given whole stay as they are."""

from __future__ import annotations

import pytest

from gateway.errors import APIError
from gateway.item_references import referred
from gateway.stored import keep
from gateway.tenants import Tenant
from openapi.items import FunctionCallOutputItem, MessageItem
from openapi.responses import ResponseRequest
from tests.gateway.conftest import KEY
from tests.gateway.test_stored import made

ANSWER = {"type": "message", "id": f"msg_{'a' * 32}", "role": "assistant",
          "status": "completed", "content": [{"type": "output_text", "text": "Rain.",
                                              "annotations": [], "logprobs": []}]}


def asking(*references: str) -> ResponseRequest:
    return ResponseRequest.model_validate({"model": "tiny-llama", "input": [
        {"role": "user", "content": "Before."},
        *({"type": "item_reference", "id": named} for named in references)]})


@pytest.fixture()
def kept(managed):
    """acme's conversation (its user's question) and stored response (its answer)."""
    client, _ = managed
    talk = client.post("/v1/conversations", headers=KEY, json={"items": [
        {"role": "user", "content": "Weather?"}]}).json()
    question, = client.app.state.conversations.items(talk["id"], "acme")
    assert client.portal.call(keep, client.app.state.manager, Tenant("acme"),
                              made(output=[ANSWER]), None,
                              [FunctionCallOutputItem(type="function_call_output",
                                                      call_id="c1", output="sunny")])
    return client, question


def test_a_reference_is_the_item_of_that_id_where_it_is_kept(kept) -> None:
    client, question = kept
    state = client.app.state
    said = referred(state, "acme", asking(question["id"], ANSWER["id"]), [])
    assert said.input == [MessageItem(role="user", content="Before."),
                          MessageItem.model_validate(question),
                          MessageItem.model_validate(ANSWER)]
    earlier = [{**question, "content": [{"type": "input_text", "text": "As it was read."}]}]
    first = referred(state, "acme", asking(question["id"]), earlier).input[1]
    assert first.text() == "As it was read."  # what the request goes on from comes first
    whole = asking()
    assert referred(state, "acme", whole, []) is whole


@pytest.mark.parametrize("tenant", ["acme", "beta"])
def test_an_item_kept_nowhere_for_the_tenant_is_a_404_naming_its_place(kept, tenant) -> None:
    client, question = kept
    named = f"msg_{'f' * 32}" if tenant == "acme" else question["id"]
    with pytest.raises(APIError) as missing:
        referred(client.app.state, tenant, asking(ANSWER["id"] if tenant == "acme" else
                                                  question["id"], named), [])
    assert (missing.value.status, missing.value.code, missing.value.param) == \
        (404, "item_not_found", "input[1]" if tenant == "beta" else "input[2]")
    assert named in missing.value.message


def test_a_conversations_items_may_be_references(kept) -> None:
    client, question = kept
    made = client.post("/v1/conversations", headers=KEY, json={"items": [
        {"type": "item_reference", "id": ANSWER["id"]}]})
    assert made.status_code == 200, made.text
    url = f"/v1/conversations/{made.json()['id']}/items"
    added = client.post(url, headers=KEY, json={"items": [
        {"role": "user", "content": "And?"}, {"type": "item_reference", "id": question["id"]}]})
    assert added.status_code == 200, added.text
    items = client.app.state.conversations.items(made.json()["id"], "acme")
    assert [(i["role"], i["content"][0]["text"]) for i in items] == \
        [("assistant", "Rain."), ("user", "And?"), ("user", "Weather?")]
    assert not {i["id"] for i in items} & {ANSWER["id"], question["id"]}  # ids of their own
    for key, named in ((KEY, f"msg_{'f' * 32}"), ({"Authorization": "Bearer sk-beta"},
                                                   question["id"])):
        missing = client.post("/v1/conversations", headers=key, json={"items": [
            {"role": "user", "content": "Hi."}, {"type": "item_reference", "id": named}]})
        assert (missing.status_code, missing.json()["error"]["param"]) == (404, "items[1]")

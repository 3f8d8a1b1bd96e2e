"""Conversations, the gateway's side, with the manager's real records behind it: a conversation
keeps its first items and those added later in order, each with an id of its own, as OpenAI's
Conversations API lists them (each answer as the official SDK's types have it); its items are
paged, read and deleted one by one; its metadata is replaced; it is its tenant's alone until
deleted; what the routes cannot read is an OpenAI-shaped 400 or 404, and a conversation past
the storage quota a 403. A done response's turn is added to its conversation; one the
conversation cannot take is not a failure, and a background one's is added only if it settles
(not once cancelled). While one response goes on in a conversation, another
there is OpenAI's 400 `conversation_locked`, and a background one waits its turn."""

from __future__ import annotations

import json
import re
import time

import pytest
from openai.types.conversations.conversation import Conversation
from openai.types.conversations.conversation_deleted_resource import ConversationDeletedResource
from openai.types.conversations.conversation_item import ConversationItem
from openai.types.conversations.conversation_item_list import ConversationItemList
from pydantic import TypeAdapter

from gateway import background
from gateway.conversations import settled, went_on
from gateway.records import change
from gateway.settings import GatewaySettings
from gateway.tenants import Tenant
from openapi.items import MessageItem
from tests.gateway.conftest import KEY, serving
from tests.gateway.test_background import settled as polled
from tests.gateway.test_validation import assert_openai_error
from tests.workers.manager.test_response_store import CREATED, REQUEST, body_of
from wire.store import StoreAction

BETA = {"Authorization": "Bearer sk-beta"}
ITEM_ID = re.compile(r"(msg|fc|fco)_[0-9a-f]{32}")
FIRST = [{"role": "user", "content": "Weather in Paris?", "id": "msg_mine"},
         {"type": "function_call", "call_id": "c1", "name": "weather", "arguments": "{}"},
         {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
         {"type": "message", "role": "assistant", "content": [
             {"type": "output_text", "text": "Sunny.", "logprobs": [
                 {"token": "Sunny", "logprob": -0.5, "bytes": [83], "top_logprobs": []}]}]}]
KEPT = [{"type": "message", "role": "user", "status": "completed",
         "content": [{"type": "input_text", "text": "Weather in Paris?"}]},
        {"type": "function_call", "call_id": "c1", "name": "weather", "arguments": "{}",
         "status": "completed"},
        {"type": "function_call_output", "call_id": "c1", "output": "sunny",
         "status": "completed"},
        {"type": "message", "role": "assistant", "status": "completed", "content": [
            {"type": "output_text", "text": "Sunny.", "logprobs": [], "annotations": []}]}]


def as_the_sdk_reads(made: dict, kind) -> dict:
    """`made` after checking it against the official SDK's own type for it, strictly."""
    TypeAdapter(kind).validate_python(made)
    return made


def without_ids(items: list[dict]) -> list[dict]:
    assert all(ITEM_ID.fullmatch(item["id"]) for item in items), items
    return [{k: v for k, v in item.items() if k != "id"} for item in items]


@pytest.fixture()
def talk(managed):
    client, _ = managed
    made = client.post("/v1/conversations", headers=KEY,
                       json={"items": FIRST, "metadata": {"topic": "weather"}})
    assert made.status_code == 200, made.text
    return client, made.json()


def test_a_conversation_keeps_its_items_in_order_each_with_an_id_of_its_own(talk) -> None:
    client, made = talk
    as_the_sdk_reads(made, Conversation)
    assert made["object"] == "conversation" and made["metadata"] == {"topic": "weather"}
    assert re.fullmatch(r"conv_[0-9a-f]{32}", made["id"])
    assert client.get(f"/v1/conversations/{made['id']}", headers=KEY).json() == made
    items = as_the_sdk_reads(client.get(f"/v1/conversations/{made['id']}/items",
                                        headers=KEY).json(), ConversationItemList)
    assert without_ids(items["data"]) == KEPT[::-1]  # the last first, by default
    assert items["data"][-1]["id"] != "msg_mine"  # an id sent is not the item's
    listed = client.get(f"/v1/conversations/{made['id']}/items?order=asc&include="
                        "message.output_text.logprobs", headers=KEY).json()
    assert listed["data"][-1]["content"][0]["logprobs"] == FIRST[-1]["content"][0]["logprobs"]
    assert (listed["first_id"], listed["last_id"], listed["has_more"]) == \
        (listed["data"][0]["id"], listed["data"][-1]["id"], False)

    added = client.post(f"/v1/conversations/{made['id']}/items", headers=KEY,
                        json={"items": [{"role": "user", "content": "And tomorrow?"}]}).json()
    assert without_ids(added["data"]) == [{"type": "message", "role": "user", "status":
                                           "completed", "content": [
                                               {"type": "input_text", "text": "And tomorrow?"}]}]
    every = client.get(f"/v1/conversations/{made['id']}/items?order=asc", headers=KEY).json()
    assert [i["id"] for i in every["data"]] == \
        [i["id"] for i in listed["data"]] + [added["first_id"]]


def test_items_are_paged_read_and_deleted_one_by_one(talk) -> None:
    client, made = talk
    url = f"/v1/conversations/{made['id']}/items"
    every = [i["id"] for i in client.get(f"{url}?order=asc", headers=KEY).json()["data"]]
    first = client.get(f"{url}?order=asc&limit=1", headers=KEY).json()
    assert [i["id"] for i in first["data"]] == every[:1] and first["has_more"]
    rest = client.get(f"{url}?order=asc&limit=2&after={every[0]}", headers=KEY).json()
    assert [i["id"] for i in rest["data"]] == every[1:3] and rest["has_more"]
    back = client.get(f"{url}?limit=2&after={every[2]}", headers=KEY).json()
    assert [i["id"] for i in back["data"]] == every[1::-1] and not back["has_more"]

    one = as_the_sdk_reads(client.get(f"{url}/{every[1]}", headers=KEY).json(),
                           ConversationItem)
    assert without_ids([one]) == [KEPT[1]]
    assert client.delete(f"{url}/{every[1]}", headers=KEY).json() == made
    assert [i["id"] for i in client.get(f"{url}?order=asc", headers=KEY).json()["data"]] == \
        every[:1] + every[2:]
    for gone in (client.get(f"{url}/{every[1]}", headers=KEY),
                 client.delete(f"{url}/{every[1]}", headers=KEY)):
        error = assert_openai_error(gone, 404)
        assert (error["code"], error["param"]) == ("item_not_found", "item_id")
    error = assert_openai_error(client.get(f"{url}?after=msg_nothing", headers=KEY), 404)
    assert error["param"] == "after"


def test_metadata_is_replaced_and_a_deleted_conversation_is_gone(talk) -> None:
    client, made = talk
    url = f"/v1/conversations/{made['id']}"
    tagged = client.post(url, headers=KEY, json={"metadata": {"topic": "rain", "n": "2"}})
    assert tagged.json() == {**made, "metadata": {"topic": "rain", "n": "2"}}
    assert client.post(url, headers=KEY, json={"metadata": None}).json()["metadata"] == {}
    for request in (lambda: client.get(url, headers=BETA),
                    lambda: client.get(f"{url}/items", headers=BETA),
                    lambda: client.post(f"{url}/items", headers=BETA,
                                        json={"items": [{"role": "user", "content": "hi"}]}),
                    lambda: client.delete(url, headers=BETA)):
        error = assert_openai_error(request(), 404)
        assert (error["code"], error["param"]) == ("conversation_not_found", "conversation_id")
    assert as_the_sdk_reads(client.delete(url, headers=KEY).json(),
                            ConversationDeletedResource) == \
        {"id": made["id"], "object": "conversation.deleted", "deleted": True}
    for request in (lambda: client.get(url, headers=KEY),
                    lambda: client.get(f"{url}/items", headers=KEY),
                    lambda: client.delete(url, headers=KEY)):
        assert assert_openai_error(request(), 404)["code"] == "conversation_not_found"
    assert client.app.state.conversations.items(made["id"], "acme") == []


@pytest.mark.parametrize(("path", "body", "param"), [
    ("", {"items": [{"role": "user", "content": "hi"}] * 21}, "items"),
    ("", {"metadata": {f"k{i}": "v" for i in range(17)}}, "metadata"),
    ("", {"items": [{"type": "function_call", "call_id": "", "name": "f", "arguments": ""}]},
     "items.0.call_id"),
    ("", {"items": [], "topic": "x"}, "topic"),
    ("/{id}", {}, "metadata"),
    ("/{id}", {"metadata": {"k": "v" * 513}}, "metadata"),
    ("/{id}/items", {"items": []}, "items"),
    ("/{id}/items", {"items": [{"role": "critic", "content": "hi"}]}, "items.0.role"),
])
def test_what_the_routes_cannot_read_is_a_400_naming_it(talk, path: str, body: dict,
                                                         param: str) -> None:
    client, made = talk
    refused = client.post("/v1/conversations" + path.format(id=made["id"]), headers=KEY,
                          json=body)
    assert assert_openai_error(refused, 400)["param"] == param
    assert len(client.get(f"/v1/conversations/{made['id']}/items", headers=KEY).json()[
        "data"]) == len(FIRST)


def test_a_conversation_past_the_storage_quota_is_a_403(tmp_path) -> None:
    settings = GatewaySettings(data_dir=tmp_path, api_keys="acme=sk-acme",
                               manager=f"ipc://{tmp_path}/manager.sock",
                               max_storage_mb=1300 / 2**20)  # two items fit
    with serving(settings) as (client, _):
        items = [{"role": "user", "content": "x" * 400}]
        made = client.post("/v1/conversations", headers=KEY, json={"items": items}).json()
        url = f"/v1/conversations/{made['id']}/items"
        assert client.post(url, headers=KEY, json={"items": items}).status_code == 200
        error = assert_openai_error(client.post(url, headers=KEY, json={"items": items}), 403)
        assert error["code"] == "storage_quota_exceeded"
        assert len(client.get(url, headers=KEY).json()["data"]) == 2
        kept = client.app.state.conversations.items(made["id"], "acme")
        assert client.get("/dashboard/api/usage", headers=KEY).json()["storage"][
            "used_bytes"] == len("{}") + sum(len(json.dumps(item)) for item in kept)


def test_a_done_response_adds_its_turn_and_one_that_cannot_is_not_a_failure(talk) -> None:
    client, made = talk
    output = {"type": "message", "id": f"msg_{'e' * 32}", "status": "completed",
              "role": "assistant", "content": [{"type": "output_text", "text": "Rain."}]}
    response = {"id": f"resp_{'f' * 32}", "status": "incomplete", "output": [output]}
    sent = [MessageItem(role="user", content="And tomorrow?", id="msg_mine")]

    def go_on(conversation: str | None, status: str = "incomplete") -> bool | None:
        return client.portal.call(went_on, client.app.state.manager, Tenant("acme"),
                                  conversation, {**response, "status": status}, sent)

    assert go_on(made["id"]) is True
    items = client.app.state.conversations.items(made["id"], "acme")
    assert without_ids(items[-2:-1]) == [{"type": "message", "role": "user", "status":
                                          "completed", "content": [
                                              {"type": "input_text", "text": "And tomorrow?"}]}]
    assert items[-1] == output  # the output item as answered, its id kept
    assert go_on(made["id"], "failed") is None and go_on(None) is None
    assert len(client.app.state.conversations.items(made["id"], "acme")) == len(FIRST) + 2
    assert client.delete(f"/v1/conversations/{made['id']}", headers=KEY).status_code == 200
    assert go_on(made["id"]) is False


def test_a_background_responses_turn_is_not_added_once_it_was_cancelled(talk) -> None:
    client, made = talk
    manager, before = client.app.state.manager, len(FIRST)
    output = {"type": "message", "id": f"msg_{'e' * 32}", "status": "completed",
              "role": "assistant", "content": [{"type": "output_text", "text": "Rain."}]}

    def queued(response_id: str) -> None:
        record = {"id": response_id, "created_at": CREATED, "own": 1, "request": REQUEST,
                  "body": body_of(response_id, "queued"),
                  "conversation": [{"type": "message", "role": "user", "content": "Hi"}]}
        client.portal.call(lambda: change(manager, StoreAction.ADD_RESPONSE, "acme",
                                          record=json.dumps(record)))

    def run_ends(response_id: str) -> tuple[bool, bool | None]:
        return client.portal.call(settled, manager, Tenant("acme"), made["id"],
                                  {**body_of(response_id, "completed"), "output": [output]},
                                  [MessageItem(role="user", content="And tomorrow?")])

    ran, cancelled = f"resp_{'a' * 32}", f"resp_{'b' * 32}"
    for response_id in (ran, cancelled):
        queued(response_id)
    assert run_ends(ran) == (True, True)
    assert client.app.state.conversations.items(made["id"], "acme")[-1] == output
    assert client.post(f"/v1/responses/{cancelled}/cancel", headers=KEY).status_code == 200
    assert run_ends(cancelled) == (False, None)  # its run ended a moment after the cancel
    assert client.get(f"/v1/responses/{cancelled}", headers=KEY).json()["status"] == \
        "cancelled"
    assert len(client.app.state.conversations.items(made["id"], "acme")) == before + 2


@pytest.mark.parametrize("query", ["include=reasoning.encrypted_content",
                                   "include[]=reasoning.encrypted_content"])
def test_only_logprobs_can_be_included(talk, query: str) -> None:
    client, made = talk
    refused = client.get(f"/v1/conversations/{made['id']}/items?{query}", headers=KEY)
    assert assert_openai_error(refused, 400)["param"].startswith("include")
    sdk_form = client.get(f"/v1/conversations/{made['id']}/items?include[]="
                          "message.output_text.logprobs", headers=KEY).json()
    assert sdk_form["data"][0]["content"][0]["logprobs"] == FIRST[-1]["content"][0]["logprobs"]


def test_one_response_at_a_time_goes_on_in_a_conversation(talk, monkeypatch) -> None:
    monkeypatch.setattr(background, "UNAVAILABLE_TRIES", 0)  # no workers here: a run's 503 ends it
    client, made = talk
    ask = {"model": "tiny-llama", "input": "And now?", "conversation": made["id"]}
    give = client.app.state.turns.take("acme", made["id"])  # a response going on in it
    locked = assert_openai_error(client.post("/v1/responses", headers=KEY, json=ask), 400)
    assert (locked["code"], locked["param"]) == ("conversation_locked", "conversation")
    assert "retry" in locked["message"]
    assert client.app.state.metrics.rejected.labels("acme", "conversation_locked")._value.get() \
        == 1
    assert client.post("/v1/responses", headers=BETA, json={**ask, "model": "tiny-llama"}) \
        .status_code == 404  # not beta's, held or not
    queued = client.post("/v1/responses", headers=KEY, json={**ask, "background": True})
    assert queued.status_code == 200, queued.text
    time.sleep(1.2)  # its run waits for the turn, asking nothing of the endpoint meanwhile
    assert client.get(f"/v1/responses/{queued.json()['id']}", headers=KEY).json()[
        "status"] == "queued"
    give()
    assert polled(client, queued.json()["id"])["status"] == "failed"  # it ran: the 503
    assert client.app.state.metrics.rejected.labels("acme", "conversation_locked")._value.get() \
        == 1  # its run's wait refused nothing
    for _ in range(2):  # a response that fails gives the turn back
        assert client.post("/v1/responses", headers=KEY, json=ask).status_code == 503

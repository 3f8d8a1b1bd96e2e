"""Stored chat completions, the gateway's side, with the manager's real records behind it: a
completion is kept with its messages as listed back (text, parts, calls, ids) and its metadata;
the routes refuse what they cannot read with OpenAI-shaped 400s and 404s, and new metadata
replaces the old (null: none); one the manager cannot keep is not the request's failure."""

from __future__ import annotations

import time

import pytest

from gateway.stored_chat import keep
from gateway.tenants import Tenant
from openapi.chat import ChatCompletionRequest
from openapi.stored_chat import StoredChatCompletion
from tests.gateway.conftest import KEY
from tests.gateway.test_validation import assert_openai_error

ID = f"chatcmpl-{'a' * 32}"
NOW = int(time.time())
BETA = {"Authorization": "Bearer sk-beta"}
REQUEST = ChatCompletionRequest.model_validate({
    "model": "tiny-llama", "store": True, "metadata": {"topic": "weather"}, "messages": [
        {"role": "user", "content": [{"type": "text", "text": "Weather "},
                                     {"type": "text", "text": "in Paris?"}], "name": "ann"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "w", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"}]})


def answer(chat_id: str = ID) -> dict:
    return {"id": chat_id, "object": "chat.completion", "created": NOW,
            "model": "tiny-llama", "choices": [{"index": 0, "finish_reason": "stop", "message": {
                "role": "assistant", "content": "Sunny.", "refusal": None}}],
            "usage": {"prompt_tokens": 9, "completion_tokens": 2, "total_tokens": 11}}


@pytest.fixture()
def kept(managed):
    client, _ = managed
    assert client.portal.call(keep, client.app.state.manager, Tenant("acme"), answer(), REQUEST)
    return client


def test_a_kept_completion_lists_its_messages_as_sent(kept) -> None:
    assert kept.get(f"/v1/chat/completions/{ID}", headers=KEY).json() == \
        StoredChatCompletion.model_validate({**answer(), "metadata": {"topic": "weather"}}
                                            ).model_dump(mode="json")
    listed = kept.get(f"/v1/chat/completions/{ID}/messages", headers=KEY).json()
    assert listed["data"] == [
        {"id": f"{ID}-0", "role": "user", "content": "Weather in Paris?", "name": "ann",
         "content_parts": [{"type": "text", "text": "Weather "},
                           {"type": "text", "text": "in Paris?"}]},
        {"id": f"{ID}-1", "role": "assistant", "content": None, "content_parts": None,
         "tool_calls": [{"id": "c1", "type": "function",
                         "function": {"name": "w", "arguments": "{}"}}]},
        {"id": f"{ID}-2", "role": "tool", "content": "sunny", "content_parts": None,
         "tool_call_id": "c1"}]
    assert (listed["first_id"], listed["last_id"], listed["has_more"]) == \
        (f"{ID}-0", f"{ID}-2", False)
    assert kept.get(f"/v1/chat/completions/{ID}", headers=BETA).status_code == 404


@pytest.mark.parametrize(("query", "status", "param"), [
    ("?metadata=topic", 400, "metadata"),
    ("?metadata[topic=weather", 400, "metadata"),
    ("?" + "&".join(f"metadata[k{i}]=v" for i in range(17)), 400, "metadata"),
    (f"?metadata[{'k' * 65}]=v", 400, "metadata"),
    ("?order=sideways", 400, "order"),
    ("?limit=0", 400, "limit"),
    ("?after=chatcmpl-nothing", 404, "after"),
])
def test_a_list_query_it_cannot_read_is_refused(kept, query: str, status: int,
                                                param: str) -> None:
    error = assert_openai_error(kept.get(f"/v1/chat/completions{query}", headers=KEY), status)
    assert error["param"] == param


def test_the_list_filters_by_metadata_pairs_and_model(kept) -> None:
    def listed(query: str) -> list[str]:
        return [c["id"] for c in kept.get(f"/v1/chat/completions{query}", headers=KEY).json()[
            "data"]]

    assert listed("") == listed("?metadata[topic]=weather") == listed("?model=tiny-llama") == \
        [ID]
    assert listed("?metadata[topic]=news") == listed("?metadata[other]=weather") == \
        listed("?model=acme/bot") == []
    assert kept.get("/v1/chat/completions", headers=BETA).json()["data"] == []


def test_new_metadata_replaces_the_old_and_null_clears_it(kept) -> None:
    path = f"/v1/chat/completions/{ID}"
    tagged = kept.post(path, json={"metadata": {"topic": "news", "k": "v"}}, headers=KEY)
    assert tagged.status_code == 200 and tagged.json()["metadata"] == {"topic": "news", "k": "v"}
    assert kept.post(path, json={"metadata": None}, headers=KEY).json()["metadata"] == {}
    for body, param in (({}, "metadata"), ({"metadata": {"a": 1}}, "metadata.a"),
                        ({"metadata": {}, "model": "x"}, "model"),
                        ({"metadata": {str(i): "v" for i in range(17)}}, "metadata")):
        assert assert_openai_error(kept.post(path, json=body, headers=KEY), 400)["param"] == \
            param
    for method in ("post", "get", "delete"):
        gone = kept.request(method.upper(), f"/v1/chat/completions/chatcmpl-{'b' * 32}",
                            json={"metadata": {}} if method == "post" else None, headers=KEY)
        assert assert_openai_error(gone, 404)["code"] == "chat_completion_not_found"
    assert assert_openai_error(kept.post(path, json={"metadata": {}}, headers=BETA), 404)
    assert kept.delete(path, headers=KEY).json() == {
        "id": ID, "object": "chat.completion.deleted", "deleted": True}
    assert assert_openai_error(kept.get(path, headers=KEY), 404)["param"] == "completion_id"


def test_a_completion_the_manager_cannot_keep_is_not_the_requests_failure(unmanaged) -> None:
    manager = unmanaged.app.state.manager
    assert unmanaged.portal.call(keep, manager, Tenant("acme"), answer(), REQUEST) is False

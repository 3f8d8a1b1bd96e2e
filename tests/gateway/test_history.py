"""A conversation's shape, checked as OpenAI's chat API checks it, before a worker sees it."""

from __future__ import annotations

import pytest

from gateway.tools import worker_messages
from openapi.chat import ChatCompletionRequest
from tests.gateway.conftest import KEY
from tests.gateway.test_validation import assert_openai_error

ASK = {"role": "user", "content": "Weather in Paris and Rome?"}
TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}}}}


def call(call_id: str) -> dict:
    return {"id": call_id, "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}


def calls(*ids: str) -> dict:
    return {"role": "assistant", "content": None, "tool_calls": [call(i) for i in ids]}


def result(call_id: str) -> dict:
    return {"role": "tool", "tool_call_id": call_id, "content": "sunny"}


def chat(client, messages: list[dict]):
    return client.post("/v1/chat/completions", headers=KEY, json={
        "model": "tiny-llama", "messages": messages, "tools": [TOOL], "max_tokens": 2})


BAD = [
    ("a result answering no call", [ASK, result("call_1")], "messages.1.tool_call_id",
     "'call_1' is not the id of an unanswered tool call"),
    ("a result naming another id", [ASK, calls("a"), result("b")], "messages.2.tool_call_id",
     "'b' is not the id"),
    ("one call answered twice", [ASK, calls("a"), result("a"), result("a")],
     "messages.3.tool_call_id", "'a' is not the id"),
    ("a result after the next turn", [ASK, calls("a"), result("a"), ASK, result("a")],
     "messages.4.tool_call_id", "'a' is not the id"),
    ("a call left unanswered", [ASK, calls("a", "b"), result("b"), ASK],
     "messages.1.tool_calls", "did not have response messages: a"),
    ("calls ending the conversation", [ASK, calls("a")], "messages.1.tool_calls",
     "did not have response messages: a"),
    ("two calls sharing an id", [ASK, calls("a", "a"), result("a"), result("a")],
     "messages.1.tool_calls", "share an id"),
    ("a user making calls", [{**ASK, "tool_calls": [call("a")]}], "messages.0.tool_calls",
     "only an assistant message"),
    ("a user naming a call", [{**ASK, "tool_call_id": "a"}], "messages.0.tool_call_id",
     "only a tool message"),
    ("a user saying nothing", [{"role": "user"}], "messages.0.content",
     "Missing required parameter: 'messages.0.content'"),
    ("a user's refusal part", [{"role": "user", "content": [
        {"type": "text", "text": "Hi."}, {"type": "refusal", "refusal": "No."}]}],
     "messages.0.content.1.type", "a refusal part is an assistant's"),
    ("a user's refusal", [{**ASK, "refusal": "No."}], "messages.0.refusal",
     "only an assistant message"),
    ("a tool's refusal", [ASK, calls("a"), {**result("a"), "refusal": "No."}],
     "messages.2.refusal", "only an assistant message"),
    ("an assistant's audio", [ASK, {"role": "assistant", "audio": {"id": "audio_1"}}, ASK],
     "messages.1.audio", "'messages.1.audio' is not supported: this server has no audio"),
    ("a deprecated function call", [ASK, {"role": "assistant", "content": None,
                                          "function_call": {"name": "f", "arguments": "{}"}}],
     "messages.1.function_call", "send the call as 'tool_calls'"),
    ("a system message saying nothing", [{"role": "system", "content": None}, ASK],
     "messages.0.content", "Missing required parameter"),
]


@pytest.mark.parametrize(("messages", "param", "says"), [case[1:] for case in BAD],
                         ids=[case[0] for case in BAD])
def test_a_conversation_openai_refuses_is_refused_naming_the_message(
        client, messages: list[dict], param: str, says: str) -> None:
    error = assert_openai_error(chat(client, messages), 400)
    unsupported = param.endswith((".audio", ".function_call"))
    assert (error["param"], error["code"]) == \
        (param, "unsupported_parameter" if unsupported else "invalid_request")
    assert says in error["message"]


def test_conversations_with_calls_answered_in_any_order_pass_the_check(client) -> None:
    """Past the check, these reach for a worker (503: no manager behind these tests); the
    last sends back an answer of OpenAI's with its unset fields null, as a client may."""
    for messages in ([ASK, calls("a", "b"), result("b"), result("a"), ASK],
                     [ASK, calls("a"), result("a"), calls("b"), result("b")],
                     [ASK, {"role": "assistant", "content": "Checking.", "tool_calls": None},
                      ASK, calls("a"), result("a"), {"role": "assistant", "content": "Sunny."}],
                     [{"role": "developer", "content": "Be brief."}, ASK],
                     [ASK, {"role": "assistant", "content": "Sunny.", "refusal": None,
                            "audio": None, "function_call": None, "annotations": []}, ASK]):
        assert_openai_error(chat(client, messages), 503)


REFUSED = [ASK, {"role": "assistant", "content": [{"type": "refusal", "refusal": "I can't."}]},
           ASK, {"role": "assistant", "content": None, "refusal": "I still can't."},
           ASK, {"role": "assistant", "content": [{"type": "text", "text": "Well, "},
                                                  {"type": "refusal", "refusal": "no."}]},
           ASK, {"role": "assistant", "content": "Sorry.", "refusal": "I can't."}]


def test_an_assistants_refusals_pass_and_reach_the_prompt_as_its_words(client) -> None:
    """OpenAI's assistant messages carry a refusal as a content part or as `refusal`, and
    OpenAI's SDK sends them back in a conversation as it got them."""
    assert_openai_error(chat(client, [*REFUSED, ASK]), 503)  # past the check, to a worker
    body = ChatCompletionRequest.model_validate({"model": "m", "messages": [*REFUSED, ASK]})
    assert [(m.role, m.content) for m in worker_messages(body)][1::2] == [
        ("assistant", "I can't."), ("assistant", "I still can't."), ("assistant", "Well, no."),
        ("assistant", "Sorry.\nI can't.")]  # its content, then its refusal on a line of its own

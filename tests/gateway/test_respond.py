"""The Responses API on the chat path: requests as chat requests, answers and stream events."""

from __future__ import annotations

import json

import pytest

from gateway.chat_stream import ChatStream
from gateway.errors import APIError
from gateway.respond import as_chat, described, renamed, response, wants_logprobs
from gateway.respond_stream import ResponseEvents
from gateway.responses import sse
from gateway.serving import PromptResult
from gateway.tools import tool_mode
from openapi.responses import Response, ResponseRequest, ResponseUsage
from wire import manager as W

TOOL = {"type": "function", "name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}}}
LOGPROBS = "message.output_text.logprobs"
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


def request(**fields) -> ResponseRequest:
    return ResponseRequest.model_validate({"model": "m", "input": "Weather?", **fields})


def call_item(call_id: str) -> dict:
    return {"type": "function_call", "call_id": call_id, "name": "get_weather",
            "arguments": '{"city": "Paris"}'}


def output_item(call_id: str) -> dict:
    return {"type": "function_call_output", "call_id": call_id, "output": "sunny"}


def test_a_request_becomes_the_chat_request_that_asks_the_same() -> None:
    chat = as_chat(request(
        instructions="Be brief.", max_output_tokens=7, temperature=0.5, tools=[TOOL],
        tool_choice={"type": "function", "name": "get_weather"}, parallel_tool_calls=False,
        text={"format": {"type": "json_schema", "name": "w", "schema": {"type": "object"}}},
        input=[{"role": "user", "content": [{"type": "input_text", "text": "Weather "},
                                            {"type": "input_text", "text": "in Paris?"}]},
               {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
                "content": [{"type": "output_text", "text": "Let me look.",
                             "annotations": [], "logprobs": []}]},
               call_item("c1"), call_item("c2"), output_item("c2"), output_item("c1"),
               call_item("c3"), output_item("c3")]))
    assert [(m.role, m.text(), m.tool_call_id) for m in chat.messages] == [
        ("system", "Be brief.", None), ("user", "Weather in Paris?", None),
        ("assistant", "Let me look.", None), ("tool", "sunny", "c2"), ("tool", "sunny", "c1"),
        ("assistant", "", None), ("tool", "sunny", "c3")]
    assert [c.id for c in chat.messages[2].tool_calls] == ["c1", "c2"]
    assert chat.messages[5].tool_calls[0].function.arguments == '{"city": "Paris"}'
    assert (chat.max_completion_tokens, chat.temperature, chat.parallel_tool_calls) == \
        (7, 0.5, False)
    assert chat.tools[0].function.name == "get_weather" and \
        chat.tool_choice.function.name == "get_weather"
    assert chat.response_format.json_schema.schema_ == {"type": "object"}
    assert as_chat(request()).messages[0].role == "user"


def test_an_assistants_refusal_sent_back_reads_as_its_words() -> None:
    """An OpenAI model's output message may hold a refusal part; sent back, it is what the
    assistant said, after its text."""
    chat = as_chat(request(input=[
        {"role": "user", "content": "Weather?"},
        {"type": "message", "role": "assistant", "content": [
            {"type": "output_text", "text": "Well, "}, {"type": "refusal", "refusal": "no."}]},
        {"role": "user", "content": "Please?"}]))
    assert [(m.role, m.text()) for m in chat.messages] == [
        ("user", "Weather?"), ("assistant", "Well, no."), ("user", "Please?")]


@pytest.mark.parametrize(("fields", "param", "words"), [
    ({"metadata": {"k" * 65: "v"}}, "metadata", "at most 16 pairs"),
    ({"background": True, "store": False}, "store", "kept"),
    ({"max_tool_calls": 0}, "max_tool_calls", "not supported"),  # 0 == False: not unset
    ({"moderation": {"model": "omni-moderation-latest"}}, "moderation", "no moderation"),
    ({"context_management": [{"type": "compaction"}]}, "context_management", "truncation"),
    ({"prompt_cache_retention": "24h"}, "prompt_cache_retention", "no prompt cache"),
    ({"image": {"context_compression": "auto"}}, "image", "text only"),
    ({"include": [LOGPROBS, "reasoning.encrypted_content"]}, "include.1", "only"),
    ({"input": []}, "input", "empty"),
    *(({"input": [{"role": role, "content": [{"type": "input_text", "text": "a"},
                                             {"type": "refusal", "refusal": "no"}]}]},
       "input.0.content.1.type", "a refusal part is an assistant's")
      for role in ("user", "system", "developer")),
    ({"input": [output_item("c1")]}, "input.0.call_id", "No tool call found"),
    ({"input": [call_item("c1")]}, "input.0", "No tool output found for function call c1"),
    ({"input": [call_item("c1"), {"role": "user", "content": "and?"}, output_item("c1")]},
     "input.0", "No tool output found"),
    ({"input": [call_item("c1"), output_item("c1"), output_item("c1")]}, "input.2.call_id",
     "No tool call found"),
    ({"input": [call_item("c1"), call_item("c1"), output_item("c1")]}, "input.1.call_id",
     "earlier function call"),
])
def test_what_the_chat_path_cannot_take_is_refused_in_the_responses_terms(
        fields: dict, param: str, words: str) -> None:
    with pytest.raises(APIError) as refused:
        as_chat(request(**fields))
    assert refused.value.status == 400 and refused.value.param == param
    assert words in refused.value.message


def test_a_request_goes_on_from_earlier_items_whose_faults_are_named_input() -> None:
    earlier = [{"type": "message", "id": "msg_1", "role": "user", "status": "completed",
                "content": [{"type": "input_text", "text": "Weather?"}]}, call_item("c1")]
    chat = as_chat(request(input=[output_item("c1")]), earlier)
    assert [m.role for m in chat.messages] == ["user", "assistant", "tool"]
    assert chat.messages[1].tool_calls[0].id == "c1" and chat.messages[0].text() == "Weather?"
    for fields, param in (({"input": "And tomorrow?"}, "input"),  # c1 left unanswered
                          ({"input": [output_item("c1"), output_item("c1")]},
                           "input.1.call_id"),
                          ({"input": [output_item("c1"), call_item("c1"), output_item("c1")]},
                           "input.1.call_id")):
        with pytest.raises(APIError) as refused:
            as_chat(request(**fields), earlier)
        assert (refused.value.status, refused.value.param) == (400, param)


def test_a_chat_refusal_is_renamed_to_the_responses_field() -> None:
    error = APIError(400, "'max_completion_tokens' is 9; ...", "invalid_request",
                     "max_completion_tokens")
    assert (renamed(error).param, renamed(error).message) == \
        ("max_output_tokens", "'max_output_tokens' is 9; ...")
    assert renamed(APIError(400, "x", None, "tools.1.function.name")).param == "tools.1.name"
    assert renamed(APIError(400, "Invalid response_format: y", None,
                            "response_format")).message == "Invalid text.format: y"


def token(text: str) -> W.TokenLogprob:
    return W.TokenLogprob(text, -0.5, [(text, -0.5), ("x", -2.0)], list(text.encode()))


def answered(text: str, finish: str, **fields) -> Response:
    result = PromptResult(0, W.Started("r", 5))
    result.text[0], result.finish[0] = text, finish
    result.logprobs[0] = [token(text[:2]), token(text[2:])]
    result.done = W.Done("r", 0, 3)
    body = request(**fields)
    return response("resp_1", 9, body, result, tool_mode(as_chat(body)))


def test_an_answer_is_a_message_or_function_calls_with_usage() -> None:
    made = answered("Sunny.", "stop", temperature=0.2)
    assert (made.status, made.incomplete_details, made.temperature) == ("completed", None, 0.2)
    assert [(o.type, o.status, o.content[0].text) for o in made.output] == \
        [("message", "completed", "Sunny.")]
    assert (made.usage.input_tokens, made.usage.output_tokens, made.usage.total_tokens) == \
        (5, 3, 8)
    cut = answered("Sun", "length")
    assert (cut.status, cut.incomplete_details.reason, cut.output[0].status) == \
        ("incomplete", "max_output_tokens", "incomplete")
    calls = answered(f"{CALL}\n{CALL}", "stop", tools=[TOOL])
    assert [(o.type, o.name, json.loads(o.arguments), o.status) for o in calls.output] == \
        [("function_call", "get_weather", {"city": "Paris"}, "completed")] * 2
    assert calls.output[0].call_id.startswith("call_") and calls.output[0].id.startswith("fc_")
    assert calls.tools == [TOOL] and calls.status == "completed"
    half = answered(f"{CALL}\n{CALL[:50]}", "length", tools=[TOOL], tool_choice="required")
    assert [o.status for o in half.output] == ["completed", "incomplete"]
    assert half.output[1].arguments == CALL[CALL.index('{"city'):50]


def response_events(body: ResponseRequest) -> ResponseEvents:
    return ResponseEvents(described(body, Response(id="resp_1", created_at=9,
                                                   status="in_progress", model="m", output=[])))


def streamed(pieces: list[str], finish: str | None, broken: APIError | None = None,
             **fields) -> list[dict]:
    """The events of a stream of `pieces`, the last one's finish `finish`, or broken off by
    `broken` after them."""
    body = request(**fields)
    tools = tool_mode(as_chat(body))
    chunks = ChatStream(("resp_1", 9, "m"), 1, tools, wants_logprobs(body))
    events = response_events(body)
    out = [e for c in chunks.chunks(W.Started("r", 5)) for e in events.events(c)]
    for k, piece in enumerate(pieces):
        delta = W.Delta("r", 0, piece, [token(piece)], finish if k == len(pieces) - 1 else None)
        out += [e for c in chunks.chunks(delta) for e in events.events(c)]
    if broken:
        return [*out, *events.failed(broken)]
    return [*out, events.last(ResponseUsage(input_tokens=5, output_tokens=3, total_tokens=8))]


def test_a_stream_is_openais_sequence_of_events_ending_in_the_whole_response() -> None:
    events = streamed(["Sun", "ny."], "stop")
    assert [e["type"] for e in events] == [
        "response.created", "response.in_progress", "response.output_item.added",
        "response.content_part.added", "response.output_text.delta",
        "response.output_text.delta", "response.output_text.done",
        "response.content_part.done", "response.output_item.done", "response.completed"]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert events[0]["response"]["status"] == "in_progress" and \
        events[0]["response"]["output"] == []
    item = events[2]["item"]["id"]
    assert all(e["item_id"] == item and e["output_index"] == 0 for e in events[3:8])
    assert "".join(e["delta"] for e in events if "delta" in e) == "Sunny." == \
        events[6]["text"] == events[7]["part"]["text"]
    final = events[-1]["response"]
    assert final["status"] == "completed" and final["usage"]["total_tokens"] == 8
    assert final["output"] == [events[8]["item"]] and events[8]["item"]["status"] == "completed"
    assert final == answered_like(final, "Sunny.", "stop")
    cut = streamed(["Sun"], "length")
    assert cut[-1]["type"] == "response.incomplete" and \
        cut[-1]["response"]["incomplete_details"] == {"reason": "max_output_tokens"}
    assert cut[-1]["response"]["output"][0]["status"] == "incomplete"


def answered_like(streamed_response: dict, text: str, finish: str) -> dict:
    """The response at once for the same output, with the stream's ids."""
    made = answered(text, finish).model_dump()
    made["id"], made["created_at"] = streamed_response["id"], streamed_response["created_at"]
    for mine, theirs in zip(made["output"], streamed_response["output"], strict=True):
        mine["id"] = theirs["id"]
    return made


@pytest.mark.parametrize("tool_choice", ["required", "auto"])
def test_streamed_calls_come_one_item_at_a_time(tool_choice: str) -> None:
    events = streamed([CALL[:30], CALL[30:], "\n" + CALL], "stop", tools=[TOOL],
                      tool_choice=tool_choice)
    kinds = [e["type"] for e in events]
    assert kinds[:3] == ["response.created", "response.in_progress",
                         "response.output_item.added"]
    added = [e for e in events if e["type"] == "response.output_item.added"]
    done = [e for e in events if e["type"] == "response.output_item.done"]
    assert [e["output_index"] for e in added] == [0, 1] and \
        kinds.index("response.output_item.done") < kinds.index("response.output_item.added", 3)
    assert [e["item"]["name"] for e in added] == ["get_weather"] * 2
    for index in (0, 1):
        arguments = "".join(e["delta"] for e in events if e["type"] ==
                            "response.function_call_arguments.delta" and
                            e["output_index"] == index)
        assert json.loads(arguments) == {"city": "Paris"} == \
            json.loads(done[index]["item"]["arguments"])
    final = events[-1]["response"]
    assert final["status"] == "completed" and \
        [o["call_id"] for o in final["output"]] == [e["item"]["call_id"] for e in added]

def test_a_broken_off_stream_ends_in_an_error_then_the_failed_response() -> None:
    lost = APIError(503, "The worker serving acme/x stopped; retry.", "worker_unavailable")
    events = streamed(["Sun", "ny"], None, lost)
    kinds = [e["type"] for e in events]
    assert kinds[-2:] == ["error", "response.failed"] and "response.output_item.done" not in kinds
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    error = events[-2]
    assert (error["code"], error["message"], error["param"]) == \
        ("worker_unavailable", lost.message, None)
    assert error["error"] == lost.body()["error"]  # the key on which the SDKs raise
    assert sse(error).startswith(b"event: error\ndata: {")
    failed = events[-1]["response"]
    assert failed["status"] == "failed" and \
        failed["error"] == {"code": "server_error", "message": lost.message}
    assert [(o["status"], o["content"][0]["text"]) for o in failed["output"]] == \
        [("incomplete", "Sunny")]
    assert Response.model_validate(failed).error.code == "server_error"
    calling = streamed([CALL[:60]], None, lost, tools=[TOOL], tool_choice="required")
    assert [(o["type"], o["status"]) for o in calling[-1]["response"]["output"]] == \
        [("function_call", "incomplete")]
    nothing_yet = response_events(request()).failed(APIError(500, "lost", None))
    assert [e["type"] for e in nothing_yet] == ["response.created", "response.in_progress",
                                                "error", "response.failed"]
    assert nothing_yet[-2]["code"] is None and nothing_yet[-1]["response"]["output"] == []
    busy = response_events(request()).failed(APIError(429, "busy", "rate_limit_exceeded"))
    assert busy[-1]["response"]["error"]["code"] == "rate_limit_exceeded"


def test_logprobs_come_with_the_text_at_once_and_streamed_never_with_calls() -> None:
    made = answered("Sunny.", "stop", include=[LOGPROBS], top_logprobs=1)
    assert made.output[0].content[0].logprobs == [
        {"token": t, "logprob": -0.5, "bytes": list(t.encode()),
         "top_logprobs": [{"token": t, "logprob": -0.5, "bytes": list(t.encode())},
                          {"token": "x", "logprob": -2.0, "bytes": [120]}]}
        for t in ("Su", "nny.")]
    assert answered("Sunny.", "stop").output[0].content[0].logprobs == []
    assert as_chat(request(top_logprobs=0)).logprobs  # top_logprobs alone asks for them
    events = streamed(["Sun", "ny."], "stop", include=[LOGPROBS])
    deltas = [e["logprobs"] for e in events if e["type"] == "response.output_text.delta"]
    assert [[lp["token"] for lp in d] for d in deltas] == [["Sun"], ["ny."]]
    final = events[-1]["response"]["output"][0]["content"][0]["logprobs"]
    assert final == deltas[0] + deltas[1] == \
        next(e for e in events if e["type"] == "response.output_text.done")["logprobs"]
    for tool_choice in ("auto", "required"):
        calls = streamed([CALL[:30], CALL[30:]], "stop", tools=[TOOL], tool_choice=tool_choice,
                         include=[LOGPROBS])
        assert [o["type"] for o in calls[-1]["response"]["output"]] == ["function_call"]
        assert answered(CALL, "stop", tools=[TOOL], tool_choice=tool_choice,
                        include=[LOGPROBS]).output[0].type == "function_call"

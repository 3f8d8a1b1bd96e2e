"""Tool calls in the gateway: prompts for the worker, calls read from output, stream chunks."""

from __future__ import annotations

import json

from gateway.chat_stream import ChatStream
from gateway.tools import parse_calls, tool_mode, worker_messages
from openapi.chat import ChatCompletionRequest
from wire import manager as W

TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}}}}
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


def request(**fields) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({"model": "m", "messages": [
        {"role": "user", "content": "Weather?"}], **fields})


def test_calls_are_read_only_from_output_made_of_well_formed_calls() -> None:
    calls = parse_calls(f"{CALL}\n{CALL}", {"get_weather"})
    assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == \
        [("get_weather", {"city": "Paris"})] * 2
    assert calls[0].id.startswith("call_") and calls[0].id != calls[1].id
    assert parse_calls(CALL, {"other"}) is None
    assert parse_calls(f"Sure! {CALL}", {"get_weather"}) is None
    assert parse_calls(CALL.replace("}}", "}"), {"get_weather"}) is None
    assert parse_calls("", {"get_weather"}) is None
    deep = "[" * 100_000 + "]" * 100_000
    assert parse_calls(f"<tool_call>\n{deep}\n</tool_call>", {"get_weather"}) is None


def test_tools_calls_and_results_reach_the_prompt() -> None:
    body = request(tools=[TOOL], messages=[
        {"role": "developer", "content": "Be brief."},
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "tool_calls": [{"id": "call_1", "type": "function", "function": {
            "name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}])
    messages = worker_messages(body)
    assert [m.role for m in messages] == ["system", "user", "assistant", "tool"]
    assert messages[0].content.startswith("Be brief.\n\n# Tools")
    assert json.dumps(TOOL) in messages[0].content
    assert parse_calls(messages[2].content, {"get_weather"})[0].function.arguments == \
        '{"city": "Paris"}'
    assert messages[3].content == "<tool_response>\nsunny\n</tool_response>"


def test_a_participants_name_goes_with_its_message() -> None:
    body = request(tools=[TOOL], messages=[
        {"role": "system", "content": "Be brief.", "name": "house"},
        {"role": "user", "content": "Weather?", "name": "ann"},
        {"role": "assistant", "content": "Sunny.", "name": "bot"},
        {"role": "user", "content": "Thanks."}])
    assert [(m.role, m.name) for m in worker_messages(body)] == [
        ("system", "house"), ("user", "ann"), ("assistant", "bot"), ("user", "")]


def test_a_call_whose_arguments_are_no_json_reaches_the_prompt_as_written() -> None:
    cut = '{"city": "Par'
    body = request(tools=[TOOL], messages=[
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "tool_calls": [{"id": "call_1", "type": "function", "function": {
            "name": "get_weather", "arguments": cut}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "no such city"}])
    assert worker_messages(body)[2].content == \
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par}\n</tool_call>'


def run_stream(pieces: list[str], finish: str = "stop", parallel: bool = True) -> list[dict]:
    tools = tool_mode(request(tools=[TOOL], parallel_tool_calls=parallel))
    stream = ChatStream(("chatcmpl-1", 0, "m"), 1, tools, False)
    chunks = stream.chunks(W.Started("r", 3))
    for k, piece in enumerate(pieces):
        last = k == len(pieces) - 1
        chunks += stream.chunks(W.Delta("r", 0, piece, None, finish if last else None))
    return [c["choices"][0] for c in chunks]


def test_a_call_in_auto_mode_streams_as_tool_call_deltas() -> None:
    choices = run_stream([CALL[:5], CALL[5:30], CALL[30:]])
    calls = [c["delta"]["tool_calls"][0] for c in choices if c["delta"].get("tool_calls")]
    assert calls[0]["id"].startswith("call_") and calls[0]["function"] == {
        "name": "get_weather", "arguments": ""}
    assert json.loads(calls[1]["function"]["arguments"]) == {"city": "Paris"}
    assert choices[-1]["finish_reason"] == "tool_calls"
    assert not any(c["delta"]["content"] for c in choices)


def test_text_that_is_no_call_streams_as_content_as_soon_as_that_is_clear() -> None:
    choices = run_stream(["<to", "ast> is", " ready"])
    contents = [c["delta"]["content"] for c in choices if c["delta"]["content"]]
    assert contents == ["<toast> is", " ready"]
    assert choices[-1]["finish_reason"] == "stop"
    cut = run_stream(["<to"], finish="length")  # not yet a call's opening tag: content
    assert [c["delta"]["content"] for c in cut if c["delta"]["content"]] == ["<to"]


def test_without_parallel_calls_the_first_call_counts() -> None:
    two = [CALL, "\n" + CALL]
    assert sum(bool(c["delta"].get("tool_calls")) for c in run_stream(two)) == 4
    for pieces in (two, [CALL, "\n" + CALL[:40]]):
        single = run_stream(pieces, parallel=False)
        calls = [c["delta"]["tool_calls"][0] for c in single if c["delta"].get("tool_calls")]
        assert [c["index"] for c in calls] == [0, 0] and calls[0]["function"]["name"] == \
            "get_weather" and json.loads(calls[1]["function"]["arguments"]) == {"city": "Paris"}
        assert single[-1]["finish_reason"] == "tool_calls"


def test_a_named_choice_is_one_call_and_required_may_be_several() -> None:
    named = tool_mode(request(tools=[TOOL], tool_choice={"type": "function",
                                                         "function": {"name": "get_weather"}}))
    assert named.max_calls == 1 and named.answer(f"{CALL}\n{CALL}", "stop") == (None, "stop")
    assert len(named.answer(CALL, "stop")[0]) == 1
    required = tool_mode(request(tools=[TOOL], tool_choice="required"))
    assert len(required.answer(f"{CALL}\n{CALL}", "stop")[0]) == 2
    single = tool_mode(request(tools=[TOOL], tool_choice="required", parallel_tool_calls=False))
    assert single.max_calls == 1 and single.grammar != required.grammar


def test_calls_completed_before_a_max_tokens_cut_are_calls_with_finish_length() -> None:
    from gateway.responses import chat_choice
    from gateway.serving import PromptResult

    cut = f"{CALL}\n{CALL[:30]}"
    for choice, expected in (("required", 1), ("auto", 1)):
        mode = tool_mode(request(tools=[TOOL], tool_choice=choice))
        result = PromptResult(0, W.Started("r", 1))
        result.text[0], result.finish[0] = cut, "length"
        made = chat_choice(result, 0, False, mode)
        assert made.finish_reason == "length" and made.message.content is None
        assert len(made.message.tool_calls) == expected
    forced = tool_mode(request(tools=[TOOL], tool_choice="required"))
    result = PromptResult(0, W.Started("r", 1))
    result.text[0], result.finish[0] = CALL[:30], "length"  # cut inside the first call
    made = chat_choice(result, 0, False, forced)
    assert (made.message.content, made.message.tool_calls, made.finish_reason) == \
        (None, None, "length")  # never the raw call text as content


def test_a_streamed_cut_sends_the_completed_calls_and_finish_length() -> None:
    stream = ChatStream(("id", 0, "m"), 1, tool_mode(request(tools=[TOOL],
                                                             tool_choice="required")), False)
    chunks = stream.chunks(W.Delta("r", 0, f"{CALL}\n<tool_", finish_reason="length"))
    calls = [c["choices"][0]["delta"]["tool_calls"][0] for c in chunks
             if c["choices"][0]["delta"].get("tool_calls")]
    assert calls[0]["function"]["name"] == "get_weather" and len({c["index"] for c in calls}) == 1
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert not any(c["choices"][0]["delta"].get("content") for c in chunks)


def test_a_stop_string_ending_a_forced_call_leaves_the_call_as_far_as_it_got() -> None:
    """`stop` matched inside a forced call: the call as written (never its markup as content),
    with finish_reason "stop", not "tool_calls" (it did not end), streamed or not."""
    from gateway.responses import chat_choice
    from gateway.serving import PromptResult

    forced = tool_mode(request(tools=[TOOL], tool_choice="required"))
    second = CALL[:CALL.index('ty"')]
    for text, arguments in ((CALL[:CALL.index("Paris")], '{"city": "'),
                            (f"{CALL}\n{second}", '{"ci')):
        result = PromptResult(0, W.Started("r", 1))
        result.text[0], result.finish[0] = text, "stop"
        made = chat_choice(result, 0, False, forced)
        assert (made.message.content, made.finish_reason) == (None, "stop")
        assert made.message.tool_calls[-1].function.arguments == arguments
        stream = ChatStream(("id", 0, "m"), 1, forced, False)
        chunks = [c["choices"][0] for c in
                  stream.chunks(W.Delta("r", 0, text, finish_reason="stop"))]
        streamed = "".join(c["delta"]["tool_calls"][0]["function"]["arguments"] for c in chunks
                           if c["delta"].get("tool_calls") and
                           c["delta"]["tool_calls"][0]["index"] == text.count("<tool_call>") - 1)
        assert streamed == arguments and chunks[-1]["finish_reason"] == "stop"
    result.text[0] = CALL  # the grammar's end: the call is whole
    assert chat_choice(result, 0, False, forced).finish_reason == "tool_calls"


def test_a_cut_call_in_auto_mode_is_the_call_as_far_as_it_got() -> None:
    """Auto mode, output that opened a call and was cut by max_tokens or a `stop` string: the
    calls as written (a call not in the reader's shape: those before it), never the markup as
    content, at once or streamed alike."""
    from gateway.responses import chat_choice
    from gateway.serving import PromptResult

    auto = tool_mode(request(tools=[TOOL]))
    compact = '<tool_call>\n{"name":"get_weather","arguments":{"city":"Par'
    cases = [(CALL[:CALL.index("Paris")], '{"city": "'), (CALL[:20], None),
             (f"{CALL}\n{CALL[:CALL.index('ty')]}", '{"ci'),
             (f"\n{CALL[:CALL.index('}')]}", '{"city": "Paris"'), (compact, None)]
    for (text, arguments), finish in [(c, f) for c in cases for f in ("length", "stop")]:
        if text == compact and finish == "stop":
            continue  # not a call in the reader's shape, and not known to be cut: content
        calls = text.count("<tool_call>") - (arguments is None)
        result = PromptResult(0, W.Started("r", 1))
        result.text[0], result.finish[0] = text, finish
        made = chat_choice(result, 0, False, auto)
        assert (made.message.content, made.finish_reason) == (None, finish), text
        assert len(made.message.tool_calls or []) == calls
        if arguments is not None:
            assert made.message.tool_calls[-1].function.arguments == arguments
        streamed = run_stream([text[:15], text[15:]], finish=finish)
        assert not any(c["delta"]["content"] for c in streamed)
        deltas = [c["delta"]["tool_calls"][0] for c in streamed if c["delta"].get("tool_calls")]
        assert len(deltas) == 2 * calls and streamed[-1]["finish_reason"] == finish
        if arguments is not None:
            assert deltas[-1]["function"]["arguments"] == arguments
    result.text[0], result.finish[0] = compact, "stop"
    assert chat_choice(result, 0, False, auto).message.content == compact


def assembled(choices: list[dict]) -> tuple[str | None, list[tuple[str, str]], str]:
    """A stream's answer as a client puts it together: content, calls (name, arguments) and
    the finish_reason."""
    content = "".join(c["delta"]["content"] or "" for c in choices) or None
    calls: dict[int, list[str]] = {}
    for choice in choices:
        for delta in choice["delta"].get("tool_calls") or []:
            if delta.get("id"):
                assert delta["index"] not in calls and delta["index"] == len(calls)
                calls[delta["index"]] = [delta["function"]["name"], ""]
            calls[delta["index"]][1] += delta["function"]["arguments"] or ""
    return content, [tuple(calls[k]) for k in sorted(calls)], choices[-1]["finish_reason"]


def test_an_auto_mode_call_streams_its_arguments_as_they_are_written() -> None:
    """Its header once the name is a tool's and the arguments have begun, then the arguments
    as they grow (a client can show a long call's arguments while they are written)."""
    pieces = [CALL[:k + 3] [k:] for k in range(0, len(CALL), 3)]
    choices = run_stream(pieces)
    headers = [k for k, c in enumerate(choices) if c["delta"].get("tool_calls")
               and c["delta"]["tool_calls"][0].get("id")]
    grew = [k for k, c in enumerate(choices) if c["delta"].get("tool_calls")
            and c["delta"]["tool_calls"][0]["function"]["arguments"]]
    assert len(headers) == 1 and len(grew) >= 5 and headers[0] < grew[0]
    assert choices[grew[0]]["delta"]["tool_calls"][0]["function"]["arguments"].startswith("{")
    assert grew[-2] < len(choices) - 2  # arguments came before the last piece
    assert assembled(choices) == (None, [("get_weather", '{"city": "Paris"}')], "tool_calls")


OUTPUTS = [CALL, f"{CALL}\n{CALL.replace('Paris', 'Oslo')}", f"  \n{CALL}",
           f"{CALL} I hope this helps.", f"{CALL}\n<tool_call>\n{{\"name\": \"nope\"}}",
           CALL.replace('{"city": "Paris"}', '{"note": "a } and \\" and {", "n": [1, {}]}'),
           CALL.replace('"get_weather"', '"other"'),
           CALL.replace('{"city": "Paris"}', '"Paris"'),
           '<tool_call>\n{"name":"get_weather","arguments":{"city":"Rome"}}\n</tool_call>',
           '<tool_call>\n{"arguments": {}, "name": "get_weather"}\n</tool_call>',
           f"{CALL}, {CALL}", "<toast> is ready", "Sure, one moment."]


def test_auto_mode_streams_the_answer_it_gives_at_once() -> None:
    """For outputs in and out of the calls' shape, whole and cut at every character (by
    max_tokens or a stop string), in one piece, in two and character by character, with and
    without parallel calls: the streamed content, calls and finish_reason are the answer's at
    once."""
    from gateway.responses import chat_choice
    from gateway.serving import PromptResult

    checked = 0
    for parallel in (True, False):
        mode = tool_mode(request(tools=[TOOL], parallel_tool_calls=parallel))
        for output in OUTPUTS:
            ends = [(output, "stop")] + [(output[:k], f) for k in range(1, len(output))
                                         for f in ("length", "stop")]
            for text, finish in ends:
                result = PromptResult(0, W.Started("r", 1))
                result.text[0], result.finish[0] = text, finish
                made = chat_choice(result, 0, False, mode)
                expected = (made.message.content,
                            [(c.function.name, c.function.arguments)
                             for c in made.message.tool_calls or []], made.finish_reason)
                middle = len(text) // 2
                for pieces in ([text], [text[:middle], text[middle:]], list(text)):
                    assert assembled(run_stream(pieces, finish, parallel)) == expected, \
                        (text, finish, pieces)
                    checked += 1
    assert checked > 10_000


def test_auto_mode_calls_are_read_as_written_and_what_follows_them_is_dropped() -> None:
    auto = tool_mode(request(tools=[TOOL]))
    for text in (f"{CALL} I hope this helps.", f"{CALL}\n{CALL.replace('get_weather', 'nope')}"):
        calls, finish = auto.answer(text, "stop")
        assert [(c.function.name, c.function.arguments) for c in calls] == \
            [("get_weather", '{"city": "Paris"}')] and finish == "tool_calls"
    spaced = CALL.replace('{"city": "Paris"}', '{"city":"Paris" }')
    calls, finish = auto.answer(spaced, "stop")
    assert calls[0].function.arguments == '{"city":"Paris" }' and finish == "tool_calls"
    assert auto.answer(CALL.replace('"get_weather"', '"other"'), "stop") == \
        (None, "stop")  # no tool of that name: content
    swapped = '<tool_call>\n{"arguments": {}, "name": "get_weather"}\n</tool_call>'
    assert auto.answer(swapped, "stop")[0][0].function.name == "get_weather"

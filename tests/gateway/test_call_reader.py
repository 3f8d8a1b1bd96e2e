"""A forced mode's tool calls read as they are written: the grammar's one shape followed over
pieces of any size, a cut call kept as far as it got, and anything out of shape reported lost so
the whole text is read instead; the stream and the response made at once carry the same calls."""

from __future__ import annotations

import json

import pytest

from gateway.call_reader import CallReader
from gateway.chat_stream import ChatStream
from gateway.responses import chat_choice
from gateway.serving import PromptResult
from gateway.tools import tool_mode
from tests.gateway.test_tools import TOOL, request
from wire import manager as W
from wire.hermes import TOOL_CLOSE, TOOL_OPEN, call_text

TRICKY = {"city": "Pa}ris \"{[", "days": [1, {"deep": []}], "note": "back\\slash"}


def written(name: str, arguments: dict) -> str:
    """A call as the grammar writes it: as history and fine-tuning examples render it."""
    return call_text(name, arguments)


TWO = written("get_weather", TRICKY) + "\n" + written("get_weather", {})


@pytest.mark.parametrize("size", [1, 2, 3, 5, 8, len(TWO)])
def test_calls_are_read_the_same_over_pieces_of_any_size(size: int) -> None:
    reader, events = CallReader(), []
    for start in range(0, len(TWO), size):
        events += reader.feed(TWO[start:start + size])
    assert not reader.lost
    assert [(c.name, json.loads(c.arguments), c.done) for c in reader.calls] == \
        [("get_weather", TRICKY, True), ("get_weather", {}, True)]
    for k, call in enumerate(reader.calls):
        mine = [(name, arguments) for index, name, arguments in events if index == k]
        assert mine[0] == ("get_weather", "") and all(n is None for n, _ in mine[1:])
        assert "".join(arguments for _, arguments in mine) == call.arguments


def test_a_cut_call_keeps_its_name_and_the_arguments_so_far() -> None:
    reader = CallReader()
    reader.feed(TWO[:len(TOOL_OPEN) + 52])
    assert not reader.lost and len(reader.calls) == 1
    call = reader.calls[0]
    assert (call.name, call.done) == ("get_weather", False)
    assert call.arguments == json.dumps(TRICKY)[:len(call.arguments)]
    assert call.arguments.startswith('{"city')
    before_name = CallReader()
    assert before_name.feed(TOOL_OPEN + '{"name": "get_w') == [] and before_name.calls == []


@pytest.mark.parametrize("text", [
    "Sure, " + TWO,  # content first
    TOOL_OPEN + '{"arguments": {}, "name": "get_weather"}' + TOOL_CLOSE,  # another order
    TOOL_OPEN + '{"name":"get_weather","arguments":{}}' + TOOL_CLOSE,  # compact
    TOOL_OPEN + '{"name": "get_weather", "arguments": [1]}' + TOOL_CLOSE,  # not an object
    TOOL_OPEN + '{"name": "' + "x" * 200,  # no name is this long
    written("get_weather", {}) + "tail",
])
def test_text_out_of_the_shape_is_lost_not_misread(text: str) -> None:
    reader = CallReader()
    reader.feed(text)
    assert reader.lost


def token(piece: str) -> W.TokenLogprob:
    return W.TokenLogprob(piece, -1.0, [], list(piece.encode()))


def streamed(mode, pieces: list[str], finish: str) -> tuple[list[dict], list[tuple]]:
    stream = ChatStream(("chatcmpl-1", 0, "m"), 1, mode, True)
    chunks = stream.chunks(W.Started("r", 3))
    for k, piece in enumerate(pieces):
        chunks += stream.chunks(W.Delta("r", 0, piece, [token(piece)],
                                        finish if k == len(pieces) - 1 else None))
    choices = [c["choices"][0] for c in chunks]
    calls: dict[int, list] = {}
    for choice in choices:
        for delta in choice["delta"].get("tool_calls") or []:
            entry = calls.setdefault(delta["index"], ["", ""])
            entry[0] += delta["function"].get("name") or ""
            entry[1] += delta["function"].get("arguments") or ""
    return choices, [tuple(calls[k]) for k in sorted(calls)]


@pytest.mark.parametrize("choice", ["required", {"type": "function",
                                                  "function": {"name": "get_weather"}}])
@pytest.mark.parametrize("cut", [None, 90])
def test_a_forced_call_streams_as_written_and_equals_the_response(choice, cut) -> None:
    mode = tool_mode(request(tools=[TOOL], tool_choice=choice))
    text = written("get_weather", TRICKY)
    text, finish = (text, "stop") if cut is None else (text[:cut], "length")
    pieces = [text[i:i + 4] for i in range(0, len(text), 4)]
    choices, calls = streamed(mode, pieces, finish)
    result = PromptResult(0, W.Started("r", 3))
    result.text[0], result.finish[0] = text, finish
    result.logprobs[0] = [token(piece) for piece in pieces]
    whole = chat_choice(result, 0, True, mode)
    sent = [t["token"] for c in choices if c["logprobs"] for t in c["logprobs"]["content"]]
    assert sent == [t.token for t in whole.logprobs.content] == pieces  # each token once
    assert [(c.function.name, c.function.arguments) for c in whole.message.tool_calls] == calls
    assert whole.message.content is None and not any(c["delta"].get("content") for c in choices)
    assert whole.finish_reason == choices[-1]["finish_reason"] == \
        ("tool_calls" if cut is None else "length")
    arrived = [k for k, c in enumerate(choices)
               if any(d["function"].get("arguments") for d in c["delta"].get("tool_calls") or [])]
    assert len(arrived) > 5 and arrived[0] < len(pieces) // 2  # as written, not at the end
    if cut is not None:  # the call the cut ended, as far as it got
        assert calls[0][1] == json.dumps(TRICKY)[:len(calls[0][1])]
        assert 0 < len(calls[0][1]) < len(json.dumps(TRICKY))


def test_a_call_held_back_in_auto_mode_still_sends_its_tokens_logprobs() -> None:
    text = written("get_weather", TRICKY)
    pieces = [text[i:i + 7] for i in range(0, len(text), 7)]
    choices, calls = streamed(tool_mode(request(tools=[TOOL])), pieces, "stop")
    assert [name for name, _ in calls] == ["get_weather"] and choices[-1]["finish_reason"] == \
        "tool_calls"
    sent = [t["token"] for c in choices if c["logprobs"] for t in c["logprobs"]["content"]]
    assert sent == pieces

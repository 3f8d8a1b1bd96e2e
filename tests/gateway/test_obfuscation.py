"""Stream obfuscation: a delta's event, as the stream writes it, fills whole 64-byte blocks with
random characters, whatever the token's length; other events and a stream asked without it are
left as they are."""

from __future__ import annotations

import json

from gateway.obfuscation import BLOCK, is_delta, wanted
from gateway.responses import sse
from openapi.common import ResponseStreamOptions, StreamOptions


def _chunk(text: str) -> dict:
    return {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]}


def _data(event: dict, obfuscate: bool = True) -> bytes:
    """The JSON an event's server-sent `data:` line carries."""
    return sse(event, obfuscate).split(b"data: ", 1)[1].removesuffix(b"\n\n")


def test_every_delta_fills_whole_blocks_whatever_its_token() -> None:
    sizes = {}
    for text in ("", "a", " the", "\u00e9t\u00e9", "x" * 63, "x" * 64, "x" * 200):
        data = _data(_chunk(text))
        padded = json.loads(data)
        assert len(data) % BLOCK == 0, (text, len(data))
        assert {k: v for k, v in padded.items() if k != "obfuscation"} == _chunk(text)
        assert set(padded["obfuscation"]) <= set(
            "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")
        sizes[text] = len(data)
    assert len({sizes[t] for t in ("", "a", " the", "\u00e9t\u00e9")}) == 1  # short: one size
    assert sizes["x" * 200] > sizes["x" * 64] > sizes["a"]
    assert len({json.loads(_data(_chunk("a")))["obfuscation"] for _ in range(3)}) == 3  # random


def test_only_deltas_are_padded_and_a_request_may_turn_it_off() -> None:
    usage = {**_chunk(""), "choices": [], "usage": {"prompt_tokens": 1}}
    assert is_delta(_chunk("a")) and not is_delta(usage)
    assert _data(usage) == _data(usage, obfuscate=False)
    assert "obfuscation" not in json.loads(_data(_chunk("a"), obfuscate=False))
    assert is_delta({"type": "response.output_text.delta", "delta": "a"})
    assert is_delta({"type": "response.function_call_arguments.delta", "delta": "{"})
    assert not is_delta({"type": "response.completed", "response": {}})
    assert wanted(None) and wanted(StreamOptions()) and wanted(ResponseStreamOptions())
    assert not wanted(StreamOptions(include_usage=True, include_obfuscation=False))
    assert not wanted(ResponseStreamOptions(include_obfuscation=False))

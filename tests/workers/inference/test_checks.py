# ruff: noqa: F811  (the fixture imported from test_engine is an argument here)
"""What a request must satisfy before it waits (`workers.inference.checks`), through the engine
that applies it: the context's room, counted for a max_tokens the client asked for and cut to
fit for the server's default."""

from __future__ import annotations

from executor.local import LocalExecutor
from tests.peft_reference import build_pair
from tests.workers.inference.test_engine import MODEL, prompts, tokenizer  # noqa: F401
from wire import manager as W
from workers.inference.engine import InferenceEngine
from workers.inference.request import Request


def test_a_default_max_tokens_is_cut_to_what_fits_and_an_asked_one_is_not(tokenizer) -> None:
    """`fit`: max_tokens is the server's default, never the reason for a refusal."""
    _, ours = build_pair(MODEL, "lora", LocalExecutor.load(MODEL))
    engine = InferenceEngine(ours.eval(), tokenizer, max_context=20, eos_ids=())
    prompt = prompts()[3]
    room = 20 - len(prompt)
    assert 0 < room < 9
    asked = engine.add(Request("asked", prompt, W.SamplingParams(max_tokens=9)))
    assert asked[0].code == "context_length_exceeded"
    assert engine.add(Request("default", prompt, W.SamplingParams(max_tokens=9, fit=True,
                                                                  temperature=0))) == []
    out = []
    while engine.has_work():
        out += engine.step()
    deltas = [e for e in out if isinstance(e, W.Delta)]
    assert [e.completion_tokens for e in out if isinstance(e, W.Done)] == [room]
    assert deltas[-1].finish_reason == "length"

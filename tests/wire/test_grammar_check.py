"""A grammar past llguidance's limits validates but does not build: the gateway builds a long
one against a byte-level tokenizer and refuses it with a one-line reason, the same failure the
worker's matcher (the model's own tokenizer) meets and words the same way; a long grammar within
the limits passes."""

from __future__ import annotations

import pytest
from llguidance import LLMatcher
from transformers import AutoTokenizer

from catalogue.resolve import resolve_model
from gateway.errors import APIError
from gateway.structured import _one_form, json_grammar, strict, tool_calls_grammar
from openapi.chat import Tool
from wire.grammar_check import BUILT_FROM, refusal, worded
from workers.inference.grammar import GrammarError, Grammars


def wide(properties: int) -> dict:
    return {"type": "object", "properties": {f"p{n}": {"type": "integer"}
                                             for n in range(properties)}}


def test_a_grammar_past_the_limits_is_refused_as_the_worker_would_fail_it() -> None:
    schema = wide(11_000)
    grammar = LLMatcher.grammar_from_json_schema(_one_form(strict(schema)))
    with pytest.raises(APIError) as refused:  # validated, then built
        json_grammar(schema)
    assert refused.value.status == 400 and refused.value.param == "response_format"
    message = refused.value.message
    assert "too large for the grammar engine" in message and "u16::MAX" in message
    assert "\n" not in message and "backtrace" not in message
    tokenizer = AutoTokenizer.from_pretrained(resolve_model("tiny-llama"))
    with pytest.raises(GrammarError) as failed:
        Grammars(tokenizer, len(tokenizer)).matcher(grammar)
    assert f"Invalid response_format: {failed.value}" == message


def test_long_grammars_within_the_limits_pass() -> None:
    tools = [Tool(type="function", function={"name": f"f{n}", "parameters": wide(100)})
             for n in range(10)]
    for grammar in (json_grammar(wide(1_000)), tool_calls_grammar(tools, parallel=True)):
        assert len(grammar) > BUILT_FROM and refusal(grammar) is None


def test_a_long_grammar_that_does_not_validate_is_refused_as_validation_says() -> None:
    """Built, not validated first: the same message, every line of it."""
    schema = {**wide(1_000), "properties": {**wide(1_000)["properties"],
                                            "x": {"type": "string", "pattern": "(["}}}
    grammar = LLMatcher.grammar_from_json_schema(_one_form(strict(schema)))
    failed, messages = LLMatcher.validate_grammar_with_warnings(grammar)
    assert len(grammar) > BUILT_FROM and failed and "\n" in messages[0]
    assert refusal(grammar) == messages[0].strip()


def test_a_panic_keeps_its_first_line_and_another_error_all_of_it() -> None:
    assert worded("panic: assertion failed: x < 3\n<backtrace>\n  0: f") == (
        "the constraint is too large for the grammar engine (llguidance: assertion failed: "
        "x < 3); make the schema smaller")
    assert worded("regex parse error:\n  ([\nunclosed\n") == "regex parse error:\n  ([\nunclosed"

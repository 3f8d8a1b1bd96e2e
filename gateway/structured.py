"""Output constraints: `response_format` and tool calls -> an llguidance grammar for the worker.

JSON is generated as `json.dumps` writes it: ", " between items, ": " after keys, no other
whitespace (the form Qwen's and Hermes' templates give the calls in a conversation, and the one
`wire.hermes` renders history and fine-tuning examples in). Schemas are taken as OpenAI's
strict mode takes them: an object without `additionalProperties` allows no other keys, and a
`number` without `multipleOf` is written with at most `DECIMALS` fraction digits; so a schema
that bounds its sizes (maxLength, maxItems, enums, number ranges) bounds the output. An
unusable schema is a 400 that names the problem (llguidance is strict: a keyword it cannot
enforce is an error, not a silently dropped rule), and so is one past llguidance's limits, which
validates but would not build in the worker (`wire.grammar_check`).
"""

from __future__ import annotations

import json
from typing import Any

from llguidance import LLMatcher

from gateway.errors import APIError
from wire.grammar_check import refusal
from wire.hermes import TOOL_CLOSE, TOOL_OPEN

DECIMALS = 6
ONE_FORM = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
MAX_PARALLEL_CALLS = 8
SCHEMA_KEYS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
SCHEMA_VALUES = ("items", "additionalProperties", "not", "if", "then", "else", "contains")


MAX_DEPTH = 64


def strict(schema: Any, param: str = "response_format", depth: int = 0) -> Any:
    """A copy of `schema` with the strict-mode defaults above filled in, at every level."""
    if not isinstance(schema, dict):
        return schema
    if depth > MAX_DEPTH:
        raise APIError(400, f"The schema is nested more than {MAX_DEPTH} levels deep.",
                       "invalid_request", param)
    out = dict(schema)
    types = out.get("type")
    types = types if isinstance(types, list) else [types]
    if ("object" in types or "properties" in out) and "additionalProperties" not in out:
        out["additionalProperties"] = False
    if "number" in types and "multipleOf" not in out:
        out["multipleOf"] = 10.0 ** -DECIMALS
    for key in SCHEMA_KEYS:
        if isinstance(out.get(key), dict):
            out[key] = {name: strict(sub, param, depth + 1) for name, sub in out[key].items()}
    for key in SCHEMA_LISTS:
        if isinstance(out.get(key), list):
            out[key] = [strict(sub, param, depth + 1) for sub in out[key]]
    for key in SCHEMA_VALUES:
        if isinstance(out.get(key), dict):
            out[key] = strict(out[key], param, depth + 1)
    return out


def _one_form(schema: dict) -> dict:
    return {**schema, "x-guidance": {**schema.get("x-guidance", {}), **ONE_FORM}}


def _checked(grammar: str, param: str) -> str:
    error = refusal(grammar)
    if error:
        raise APIError(400, f"Invalid {param}: {error}", "invalid_request", param)
    return grammar


def json_grammar(schema: dict | None, param: str = "response_format") -> str:
    """Any JSON object (schema None: OpenAI's JSON mode), else JSON valid for `schema`."""
    target = {"type": "object"} if schema is None else strict(schema, param)
    try:
        grammar = LLMatcher.grammar_from_json_schema(_one_form(target))
    except ValueError as exc:
        raise APIError(400, f"Invalid {param}: {exc}", "invalid_request", param) from None
    return _checked(grammar, param)


def response_format_grammar(response_format: Any) -> str | None:
    if response_format is None or response_format.type == "text":
        return None
    if response_format.type == "json_object":
        return json_grammar(None)
    return json_grammar(response_format.json_schema.schema_ or {"type": "object"})


def tool_call_schema(tool: Any) -> dict:
    parameters = tool.function.parameters or {"type": "object", "properties": {}}
    return {"type": "object", "properties": {"name": {"const": tool.function.name},
                                             "arguments": parameters},
            "required": ["name", "arguments"]}


def tool_calls_grammar(tools: list[Any], parallel: bool) -> str:
    """One tool call (or up to MAX_PARALLEL_CALLS) in Hermes' format, arguments by schema."""
    schemas = [tool_call_schema(tool) for tool in tools]
    body = schemas[0] if len(schemas) == 1 else {"anyOf": schemas}
    repeat = f'("\\n" call){{0,{MAX_PARALLEL_CALLS - 1}}}' if parallel else ""
    lark = (f"start: call {repeat}\n"
            f"call: {json.dumps(TOOL_OPEN)} body {json.dumps(TOOL_CLOSE)}\n"
            f"body: %json {json.dumps(_one_form(strict(body, 'tools')))}\n")
    return _checked(LLMatcher.grammar_from_lark(lark), "tools")

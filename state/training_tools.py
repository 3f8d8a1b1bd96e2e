"""Tools and tool calls in a chat fine-tuning example (OpenAI's function-calling format, and its
deprecated `functions` / `function_call` / role `function`), turned into the text the model is
served with (`wire.hermes`): the tools listed in the system message, an assistant's calls after
its text (`training_file` wraps a tool's result). The calls are learned like any assistant text.
"""

from __future__ import annotations

import json
from typing import Any

from wire.hermes import FUNCTION_KEYS, FUNCTION_NAME, call_text, calls_message


class BadTools(ValueError):
    """What is wrong with a line's tools or calls."""


def tools_of(record: dict) -> list[dict[str, Any]]:
    """The example's tools as the API lists them ({"type": "function", "function": {...}}),
    from `tools` or the deprecated `functions`."""
    if "tools" in record and "functions" in record:
        raise BadTools("has both 'tools' and 'functions': give one")
    raw = record.get("tools", record.get("functions"))
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise BadTools("'tools' must be a list")
    tools, names = [], set()
    for k, tool in enumerate(raw):
        if "functions" in record:
            tool = {"type": "function", "function": tool}
        if not isinstance(tool, dict) or tool.get("type") != "function" or \
                set(tool) != {"type", "function"}:
            raise BadTools(f"tool {k} must be {{\"type\": \"function\", \"function\": {{...}}}}")
        function = _function(k, tool["function"])
        if function["name"] in names:
            raise BadTools(f"tool {k} names a function an earlier tool names: names must be "
                           "unique")
        names.add(function["name"])
        tools.append({"type": "function", "function": function})
    return tools


def _function(k: int, function: object) -> dict[str, Any]:
    if not isinstance(function, dict) or set(function) - set(FUNCTION_KEYS):
        raise BadTools(f"tool {k}'s function takes only {', '.join(FUNCTION_KEYS)}")
    name = function.get("name")
    if not isinstance(name, str) or not FUNCTION_NAME.fullmatch(name):
        raise BadTools(f"tool {k}'s function needs a name of letters, digits, '_' and '-' (at "
                       "most 64)")
    if not isinstance(function.get("parameters", {}), dict | None):
        raise BadTools(f"tool {k}'s parameters must be a JSON schema object")
    return {key: function[key] for key in FUNCTION_KEYS if function.get(key) is not None}


def assistant_text(i: int, message: dict, text: str | None) -> str | None:
    """An assistant message's text with its calls after it (None: neither)."""
    calls = message.get("tool_calls")
    if "function_call" in message:
        if calls is not None:
            raise BadTools(f"message {i} has both 'tool_calls' and 'function_call'")
        calls = [{"type": "function", "function": message["function_call"]}]
    if calls is None:
        return text
    if not isinstance(calls, list) or not calls:
        raise BadTools(f"message {i}'s tool_calls must be a non-empty list")
    return calls_message(text or "", [_call(i, k, call) for k, call in enumerate(calls)])


def _call(i: int, k: int, call: object) -> str:
    where = f"message {i}'s tool call {k}"
    if not isinstance(call, dict) or call.get("type", "function") != "function" or \
            not isinstance(call.get("function"), dict):
        raise BadTools(f"{where} must be {{\"type\": \"function\", \"function\": {{\"name\", "
                       "\"arguments\"}}}}")
    function = call["function"]
    name, arguments = function.get("name"), function.get("arguments")
    if not isinstance(name, str) or not FUNCTION_NAME.fullmatch(name):
        raise BadTools(f"{where} needs a function name")
    try:
        parsed = json.loads(arguments) if isinstance(arguments, str) else None
    except (ValueError, RecursionError):
        parsed = None
    if not isinstance(parsed, dict):
        raise BadTools(f"{where}'s arguments must be a JSON object in a string")
    return call_text(name, parsed)


def check_calls(messages: list[dict], tools: list[dict[str, Any]]) -> None:
    """Calls against the example's tools, results against the calls: a call names a function
    the example lists (when it lists any: a call the served model makes to an unlisted one is
    not read as a call), and a tool message's `tool_call_id` (when it has one) names a call of
    the assistant message it answers (when those calls have ids), as a served chat's must."""
    listed = {tool["function"]["name"] for tool in tools}
    ids: set[str] = set()
    for i, message in enumerate(messages, start=1):
        if message["role"] in ("tool", "function"):
            answered = message.get("tool_call_id")
            if answered is not None and not isinstance(answered, str):
                raise BadTools(f"message {i}'s tool_call_id must be a string")
            if answered is not None and ids and answered not in ids:
                raise BadTools(f"message {i} answers tool call {answered!r}, which the "
                               "assistant message before it did not make")
            continue
        calls = message.get("tool_calls") or []
        if "function_call" in message:
            calls = [{"function": message["function_call"]}]
        ids = {call["id"] for call in calls if isinstance(call.get("id"), str)}
        for k, call in enumerate(calls):
            if listed and call["function"]["name"] not in listed:
                raise BadTools(f"message {i}'s tool call {k} calls "
                               f"{call['function']['name']!r}, which the example's tools do "
                               "not list")

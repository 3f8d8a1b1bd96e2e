"""Tools and tool calls as the model reads and writes them, in Hermes' format (what Qwen and
Hermes models are trained on): the tools listed in the system message, a call as
`<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`, a tool's result as
`<tool_response>\\n...\\n</tool_response>`. One rendering for the prompts the gateway sends a
worker and for the fine-tuning examples a trainer learns from, so a model is tuned on the text
it is served with.
"""

from __future__ import annotations

import json
import re
from typing import Any

TOOL_OPEN, TOOL_CLOSE = "<tool_call>\n", "\n</tool_call>"
# a call's JSON as call_text writes it (json.dumps' form), up to its name and to its arguments
CALL_NAME, CALL_ARGUMENTS = '{"name": "', '", "arguments": '
TOOLS_PROMPT = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
    "{tools}\n</tools>\n\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{{"name": <function-name>, "arguments": <args-json-object>}}\n</tool_call>')
FUNCTION_KEYS = ("name", "description", "parameters", "strict")  # as the API's model orders them
FUNCTION_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")  # the API's FunctionName (a test holds them)


def tool_listing(tools: list[dict[str, Any]]) -> str:
    """The system message's tools part; each tool {"type": "function", "function": {...}}
    with its function's keys in FUNCTION_KEYS order and no null values."""
    return TOOLS_PROMPT.format(tools="\n".join(json.dumps(tool) for tool in tools))


def with_tools(system: str | None, tools: list[dict[str, Any]]) -> str:
    """The system message that lists `tools` (after the conversation's own, if any)."""
    listing = tool_listing(tools)
    return f"{system}\n\n{listing}" if system is not None else listing


def call_text(name: str, arguments: Any) -> str:
    return TOOL_OPEN + json.dumps({"name": name, "arguments": arguments}) + TOOL_CLOSE


def sent_call_text(name: str, arguments: str) -> str:
    """A call as a conversation's history holds it: its arguments' JSON rendered as call_text
    renders them; arguments that are no JSON (a call max_tokens cut, a model's slip) as
    written."""
    try:
        return call_text(name, json.loads(arguments))
    except (ValueError, RecursionError):
        return (TOOL_OPEN + CALL_NAME + json.dumps(name)[1:-1] + CALL_ARGUMENTS + arguments
                + "}" + TOOL_CLOSE)


def calls_message(text: str, calls: list[str]) -> str:
    """An assistant message's text followed by its calls' texts."""
    return "\n".join([text, *calls] if text else calls)


def tool_response(text: str) -> str:
    return f"<tool_response>\n{text}\n</tool_response>"

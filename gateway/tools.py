"""Tool calls for chat: tools into the prompt, calls out of the output, in Hermes' format.

The model sees the tools in the system message and answers a call as
`<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>` (the format Qwen and Hermes
models are trained on). With `tool_choice` "required" or a named function the output is
constrained to such calls (a named function: exactly one), arguments by the function's schema;
with "auto" the model may answer either way and calls are recognised in its output; with "none"
no call is read. Calls completed before a max_tokens cut are returned as calls, with
finish_reason "length"; in a forced mode also the call the cut (or a `stop` string) ended, as
far as it got, with finish_reason "length" (or "stop"), never its text as content
(`call_reader`: the grammar's calls are read as they are written).
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass

from gateway.call_reader import CallReader
from gateway.errors import APIError
from gateway.structured import MAX_PARALLEL_CALLS, tool_calls_grammar
from openapi.chat import (
    ChatCompletionRequest,
    ChatMessage,
    FunctionCall,
    NamedToolChoice,
    ToolCall,
)
from wire import manager as W
from wire.hermes import (
    TOOL_CLOSE,
    TOOL_OPEN,
    calls_message,
    sent_call_text,
    tool_response,
    with_tools,
)


@dataclass(frozen=True)
class ToolMode:
    names: frozenset[str] = frozenset()  # calls to these are read from the output (none: off)
    grammar: str | None = None  # the output must be calls (required or a named function)
    max_calls: int = 1

    def calls(self, text: str, finish: str | None = "stop") -> list[ToolCall] | None:
        """The calls `text` makes, or None if it is no (valid) call. Cut by max_tokens
        (`finish` "length"), the calls completed before the cut; in a forced mode (a grammar)
        the calls as far as they are written, one a cut or a stop string ended included, and
        none at all is [] (the output ended before a name), never content."""
        if not self.names or finish not in ("stop", "length"):
            return None
        if self.grammar is not None and (reader := self.read(text)) is not None:
            return [new_call(c.name, c.arguments) for c in reader.calls]
        calls = parse_calls(text, self.names, cut=finish == "length")
        if calls is None and finish == "length" and self.grammar is not None:
            return []
        return calls if calls is not None and len(calls) <= self.max_calls else None

    def read(self, text: str) -> CallReader | None:
        """A forced mode's calls as CallReader reads them (arguments as written); None where
        the text is out of its shape."""
        reader = CallReader()
        reader.feed(text)
        if reader.lost or len(reader.calls) > self.max_calls or \
                any(c.name not in self.names for c in reader.calls):
            return None
        return reader

    def cut_short(self, text: str) -> bool:
        """Whether a forced mode's output ends inside a call (`stop` or max_tokens ended it)."""
        reader = self.read(text) if self.grammar is not None else None
        return reader is not None and not all(c.done for c in reader.calls)

    def finish(self, calls: list | None, finish: str | None, cut_short: bool = False) -> \
            str | None:
        """OpenAI's finish_reason: "tool_calls" for calls that ended the output, not for one
        a stop string cut short."""
        return "tool_calls" if calls and finish == "stop" and not cut_short else finish


def tool_mode(body: ChatCompletionRequest) -> ToolMode:
    """`tool_choice` "auto" and "required" may make several calls (unless
    `parallel_tool_calls` is false); a named function is exactly one call of it."""
    choice = body.tool_choice or ("auto" if body.tools else "none")
    if choice != "none" and not body.tools:
        raise APIError(400, "tool_choice needs tools", "invalid_request", "tool_choice")
    if body.parallel_tool_calls is not None and not body.tools:
        raise APIError(400, "parallel_tool_calls needs tools", "invalid_request",
                       "parallel_tool_calls")
    seen: set[str] = set()
    for k, tool in enumerate(body.tools or []):
        if tool.function.name in seen:
            raise APIError(400, f"tools name the function '{tool.function.name}' twice: "
                           "function names must be unique", "invalid_request",
                           f"tools.{k}.function.name")
        seen.add(tool.function.name)
    if choice == "none":
        return ToolMode()
    names = frozenset(seen)
    parallel = body.parallel_tool_calls is not False and not isinstance(choice, NamedToolChoice)
    max_calls = MAX_PARALLEL_CALLS if parallel else 1
    if choice == "auto":
        return ToolMode(names, None, max_calls)
    tools = body.tools
    if choice != "required":
        tools = [t for t in body.tools if t.function.name == choice.function.name]
        if not tools:
            raise APIError(400, f"tool_choice names '{choice.function.name}', which is not "
                           "among the tools", "invalid_request", "tool_choice")
    return ToolMode(frozenset(t.function.name for t in tools),
                    tool_calls_grammar(tools, parallel), max_calls)


def worker_messages(body: ChatCompletionRequest) -> list[W.ChatMessage]:
    messages = [_render(m) for m in body.messages]
    if body.tools:
        tools = [t.model_dump(exclude_none=True, by_alias=True) for t in body.tools]
        if messages and messages[0].role == "system":
            messages[0] = W.ChatMessage("system", with_tools(messages[0].content, tools))
        else:
            messages.insert(0, W.ChatMessage("system", with_tools(None, tools)))
    return messages


def _render(message: ChatMessage) -> W.ChatMessage:
    role = "system" if message.role == "developer" else message.role
    text = message.text()
    if message.role == "tool":
        return W.ChatMessage("tool", tool_response(text))
    calls = [sent_call_text(c.function.name, c.function.arguments)
             for c in message.tool_calls or []]
    return W.ChatMessage(role, calls_message(text, calls) if calls else text)


def parse_calls(text: str, names: set[str], cut: bool = False) -> list[ToolCall] | None:
    """The calls `text` consists of, or None if it is not (only) well-formed calls; `cut`
    (the output ended at max_tokens): the calls before an unfinished last one."""
    rest, calls = text.strip(), []
    while rest:
        if cut and may_become_call(rest) and TOOL_CLOSE.strip() not in rest:
            break  # the call max_tokens cut short
        if not rest.startswith(TOOL_OPEN.strip()) or TOOL_CLOSE.strip() not in rest:
            return None
        inner, _, rest = rest[len(TOOL_OPEN.strip()):].partition(TOOL_CLOSE.strip())
        rest = rest.strip()
        try:
            call = json.loads(inner)
        except (ValueError, RecursionError):
            return None
        if not isinstance(call, dict) or call.get("name") not in names or \
                not isinstance(call.get("arguments"), dict):
            return None
        calls.append(new_call(call["name"], json.dumps(call["arguments"])))
    return calls or None


def new_call(name: str, arguments: str) -> ToolCall:
    return ToolCall(id=call_id(), function=FunctionCall(name=name, arguments=arguments))


def call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def may_become_call(text: str) -> bool:
    """Whether output starting with `text` may still turn out to be tool calls."""
    head = text.lstrip()
    opening = TOOL_OPEN.strip()
    return head.startswith(opening) or opening.startswith(head)

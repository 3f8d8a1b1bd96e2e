"""Tool calls for chat: tools into the prompt, calls out of the output, in Hermes' format.

The model sees the tools in the system message and answers a call as
`<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>` (the format Qwen and Hermes
models are trained on). With `tool_choice` "required" or a named function the output is
constrained to such calls (a named function: exactly one), arguments by the function's schema;
with "auto" the model may answer either way and calls are recognised in its output (without
`parallel_tool_calls`, its first call); with "none" no call is read. Output that opened a call
and was cut by max_tokens (or a `stop` string) is the calls as far as they got, the one the cut
ended included, with finish_reason "length" (or "stop"), never its markup as content.
`call_reader` reads calls as they are written (json.dumps' shape); in auto mode such a call
counts once its name is a tool's and its arguments have opened, and a stream sends it from then
on as it grows (what follows the calls out of that shape is dropped); output that opened
otherwise counts as calls once they are whole and well-formed.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass

from gateway.call_reader import CallReader, Reading
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

    def answer(self, text: str, finish: str | None) -> tuple[list[ToolCall] | None, str | None]:
        """The calls `text` makes (None: it is content) and OpenAI's finish_reason for them.
        Output that opened a call and was cut (max_tokens or a `stop` string) is the calls as
        far as they are written, the one the cut ended included (in a forced mode, any
        output); without parallel calls, auto mode's first call ends the output."""
        if not self.names or finish not in ("stop", "length"):
            return None, finish
        if (read := self._read(text)) is not None:
            made = [new_call(c.name, c.arguments) for c in read[0]]
            return made, "tool_calls" if read[1] == "past" else \
                self.finish(made, finish, read[1] == "cut")
        calls = parse_calls(text, self.names, cut=finish == "length")
        if calls is None:
            return ([] if finish == "length" and self.grammar else None), finish
        if len(calls) > self.max_calls:
            return (None, finish) if self.grammar else (calls[:self.max_calls], "tool_calls")
        return calls, self.finish(calls, finish)

    def _read(self, text: str) -> tuple[list[Reading], str] | None:
        """Call-shaped output as CallReader reads it (arguments as written): its calls and
        how it ended ("whole", "cut" inside a call, or in auto mode "past": out of that shape or
        past its max_calls after calls that count); None where it is out of that shape (in auto
        mode: before a call counts), or in auto mode did not open a call."""
        text = text.lstrip()
        if self.grammar is None and not text.startswith(TOOL_OPEN.strip()):
            return None
        reader = CallReader()
        reader.feed(text)
        if self.grammar is None:
            return self._read_auto(reader)
        if reader.lost or any(c.name not in self.names for c in reader.calls):
            return None
        end = "cut" if reader.open else "whole"
        return (reader.calls, end) if len(reader.calls) <= self.max_calls else None

    def _read_auto(self, reader: CallReader) -> tuple[list[Reading], str] | None:
        kept = self.sendable(reader)
        rest = reader.calls[len(kept):]
        if len(rest) == 1 and len(kept) < self.max_calls and not reader.lost and \
                rest[0].name in self.names:
            return [*kept, rest[0]], "cut"  # cut before its arguments: as far as it got
        if not kept:  # cut in the opening: no call
            return ([], "cut") if not reader.calls and not reader.lost else None
        past = len(reader.calls) > self.max_calls or reader.open
        if (len(kept) == self.max_calls and kept[-1].done and past) or reader.lost or rest:
            return kept, "past"
        return kept, "cut" if reader.open else "whole"

    def sendable(self, reader: CallReader) -> list[Reading]:
        """Auto mode: the calls read so far that count as calls, which a stream sends as they
        grow: in order, each of a known name whose arguments have opened, up to the first
        that is not, at most max_calls."""
        kept = []
        for call in reader.calls[:self.max_calls]:
            if call.name not in self.names or not call.arguments:
                break
            kept.append(call)
        return kept

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
            messages[0] = W.ChatMessage("system", with_tools(messages[0].content, tools),
                                        messages[0].name)
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
    return W.ChatMessage(role, calls_message(text, calls) if calls else text, message.name or "")


def parse_calls(text: str, names: set[str], cut: bool = False) -> list[ToolCall] | None:
    """The calls `text` consists of, or None if it is not (only) well-formed calls; `cut`
    (the output ended at max_tokens): the calls before an unfinished last one (none where
    that one opened the output)."""
    rest, calls = text.strip(), []
    while rest:
        if cut and may_become_call(rest) and TOOL_CLOSE.strip() not in rest:
            return calls if calls or rest.startswith(TOOL_OPEN.strip()) else None
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

"""Chat stream chunks from worker events, with tool calls streamed as OpenAI streams them.

When calls may be read from the output, a sequence's text is held back while it is (or may
still become) tool calls: as soon as it cannot, what was held is sent as content and the rest
streams on; if it finishes as calls, they are sent as `tool_calls` deltas (a header with id and
name, then the arguments) and the sequence ends with finish_reason "tool_calls" ("length" when
max_tokens cut it: the calls completed before the cut are sent).
"""

from __future__ import annotations

from gateway import responses
from gateway.tools import ToolMode, may_become_call
from openapi.chat import FunctionCallDelta, ToolCallDelta
from wire import manager as W


class ChatStream:
    def __init__(self, base: tuple[str, int, str], n: int, tools: ToolMode,
                 want_logprobs: bool) -> None:
        self.base = base
        self.n = n
        self.tools = tools
        self.want_logprobs = want_logprobs
        self.held: dict[int, tuple[str, list[W.TokenLogprob]]] = {}
        self.flowing: set[int] = set()  # sequences known to be content, not calls

    def chunks(self, event: W.Message) -> list[dict]:
        if isinstance(event, W.Started):
            return [responses.chat_chunk(*self.base, i, role=True, content="")
                    for i in range(self.n)]
        if not isinstance(event, W.Delta):
            return []
        index, logprobs = event.index, list(event.logprobs or [])
        out: list[dict] = []
        if not self.tools.names or index in self.flowing:
            out += self._content(index, event.text, logprobs)
        else:
            text, held_logprobs = self.held.pop(index, ("", []))
            text, logprobs = text + event.text, held_logprobs + logprobs
            if may_become_call(text) and not event.finish_reason:
                self.held[index] = (text, logprobs)
            elif (calls := self.tools.calls(text, event.finish_reason)) is not None:
                for k, call in enumerate(calls):
                    out.append(self._call(index, ToolCallDelta(
                        index=k, id=call.id, type="function",
                        function=FunctionCallDelta(name=call.function.name, arguments=""))))
                    out.append(self._call(index, ToolCallDelta(
                        index=k, function=FunctionCallDelta(arguments=call.function.arguments))))
                finish = self.tools.finish(calls, event.finish_reason)
                return [*out, responses.chat_chunk(*self.base, index, finish_reason=finish)]
            else:
                self.flowing.add(index)
                out += self._content(index, text, logprobs)
        if event.finish_reason:
            out.append(responses.chat_chunk(*self.base, index, finish_reason=event.finish_reason))
        return out

    def _content(self, index: int, text: str, logprobs: list[W.TokenLogprob]) -> list[dict]:
        if not text and not logprobs:
            return []
        return [responses.chat_chunk(*self.base, index, content=text,
                                     logprobs=logprobs if self.want_logprobs else None)]

    def _call(self, index: int, delta: ToolCallDelta) -> dict:
        return responses.chat_chunk(*self.base, index, tool_calls=[delta])

"""Chat stream chunks from worker events, with tool calls streamed as OpenAI streams them.

When calls may be read from the output, a sequence's text is held back while it is (or may
still become) tool calls: as soon as it cannot, what was held is sent as content and the rest
streams on; if it finishes as calls, they are sent as `tool_calls` deltas (a header with id and
name, then the arguments) and the sequence ends with finish_reason "tool_calls" (a cut: the
calls as far as they got, with "length" or "stop": `ToolMode.answer`). In a forced mode
(`tool_choice` "required" or a named function) the output can only be calls: each is sent as it
is written (`call_reader`), its header once its name is known, then its arguments as they grow.
"""

from __future__ import annotations

from gateway import responses
from gateway.call_reader import CallReader
from gateway.tools import ToolMode, call_id, may_become_call
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
        self.readers: dict[int, CallReader] = {}  # a forced mode's calls, read as written
        self.lost: set[int] = set()  # forced sequences out of the readers' shape: read whole

    def chunks(self, event: W.Message) -> list[dict]:
        if isinstance(event, W.Started):
            return [responses.chat_chunk(*self.base, i, role=True, content="")
                    for i in range(self.n)]
        if not isinstance(event, W.Delta):
            return []
        index, logprobs = event.index, list(event.logprobs or [])
        out: list[dict] = []
        if self.tools.grammar is not None and index not in self.lost:
            return self._forced(event)
        if not self.tools.names or index in self.flowing:
            out += self._content(index, event.text, logprobs)
        else:
            text, held_logprobs = self.held.pop(index, ("", []))
            text, logprobs = text + event.text, held_logprobs + logprobs
            if may_become_call(text) and not event.finish_reason:
                self.held[index] = (text, logprobs)
            elif (answer := self.tools.answer(text, event.finish_reason))[0] is not None:
                calls, finish = answer
                for k, call in enumerate(calls):
                    out.append(self._call(index, ToolCallDelta(
                        index=k, id=call.id, type="function",
                        function=FunctionCallDelta(name=call.function.name, arguments=""))))
                    out.append(self._call(index, ToolCallDelta(
                        index=k, function=FunctionCallDelta(arguments=call.function.arguments))))
                return [*out, responses.chat_chunk(
                    *self.base, index, finish_reason=finish,
                    logprobs=logprobs if self.want_logprobs else None)]
            else:
                self.flowing.add(index)
                out += self._content(index, text, logprobs)
        if event.finish_reason:
            out.append(responses.chat_chunk(*self.base, index, finish_reason=event.finish_reason))
        return out

    def _forced(self, event: W.Delta) -> list[dict]:
        """A forced mode's calls, sent as they are written: a call's header once its name is
        known, then its arguments as they grow (the tokens' logprobs with the chunks they
        made, or the next)."""
        index = event.index
        reader = self.readers.setdefault(index, CallReader())
        text, logprobs = self.held.pop(index, ("", []))
        text, logprobs = text + event.text, logprobs + list(event.logprobs or [])
        deltas = []
        for k, name, arguments in reader.feed(event.text):
            if name is not None:
                deltas.append(ToolCallDelta(index=k, id=call_id(), type="function",
                                            function=FunctionCallDelta(name=name, arguments="")))
            if arguments:
                deltas.append(ToolCallDelta(index=k, function=FunctionCallDelta(
                    arguments=arguments)))
        if reader.lost and not reader.calls:  # out of shape before anything was sent
            self.lost.add(index)
            return self.chunks(W.Delta(event.id, index, text, logprobs, event.finish_reason))
        sent = logprobs if self.want_logprobs else None
        out = [self._call(index, delta, sent if k == len(deltas) - 1 else None)
               for k, delta in enumerate(deltas)]
        if event.finish_reason:
            finish = self.tools.finish(reader.calls, event.finish_reason,
                                       not all(c.done for c in reader.calls))
            out.append(responses.chat_chunk(*self.base, index, finish_reason=finish,
                                            logprobs=None if deltas else sent))
        self.held[index] = (text, [] if out else logprobs)
        return out

    def _content(self, index: int, text: str, logprobs: list[W.TokenLogprob]) -> list[dict]:
        if not text and not logprobs:
            return []
        return [responses.chat_chunk(*self.base, index, content=text,
                                     logprobs=logprobs if self.want_logprobs else None)]

    def _call(self, index: int, delta: ToolCallDelta,
              logprobs: list[W.TokenLogprob] | None = None) -> dict:
        return responses.chat_chunk(*self.base, index, tool_calls=[delta], logprobs=logprobs)

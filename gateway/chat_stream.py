"""Chat stream chunks from worker events, with tool calls streamed as OpenAI streams them.

When calls may be read from the output, a sequence's text is held back while it is (or may
still become) tool calls: as soon as it cannot, what was held is sent as content and the rest
streams on. Once it has opened a call in `call_reader`'s shape that counts (`ToolMode.sendable`:
a tool's name, arguments begun), its calls are sent as `tool_calls` deltas as they are written
(a header with id and name, then the arguments as they grow); if it finishes as calls otherwise
written, they are sent whole. Either way the sequence ends with the answer at once
(`ToolMode.answer`): finish_reason "tool_calls", or for a cut the calls as far as they got with
"length" or "stop". In a forced mode (`tool_choice` "required" or a named function) the output
can only be calls: each is sent as it is written, its header once its name is known.
"""

from __future__ import annotations

from gateway import responses
from gateway.call_reader import CallReader
from gateway.tools import ToolMode, call_id, may_become_call
from openapi.chat import FunctionCallDelta, ToolCallDelta
from wire import manager as W
from wire.hermes import TOOL_OPEN


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
        self.texts: dict[int, str] = {}  # auto mode: the text of sequences sending calls
        self.sent: dict[int, list[int]] = {}  # auto mode: per call sent, its arguments' length

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
            logprobs = held_logprobs + logprobs
            if index in self.readers:
                self.readers[index].feed(event.text)
                self.texts[index] += event.text
                return self._auto(index, logprobs, event.finish_reason)
            text += event.text
            if self._opens_calls(index, text):
                return self._auto(index, logprobs, event.finish_reason)
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

    def _opens_calls(self, index: int, text: str) -> bool:
        """Auto mode: whether `text` opened a call that counts (its name a tool's, its
        arguments begun); from then on the sequence's calls are sent as they are read."""
        head = text.lstrip()
        if not head.startswith(TOOL_OPEN.strip()):
            return False
        reader = CallReader()
        reader.feed(head)
        if not self.tools.sendable(reader):
            return False
        self.readers[index], self.texts[index], self.sent[index] = reader, text, []
        return True

    def _auto(self, index: int, logprobs: list[W.TokenLogprob], finish: str | None) -> \
            list[dict]:
        """Auto mode's calls as far as they count (a header, then arguments as they grow); at
        the end, those of the answer at once (`ToolMode.answer` of the whole text), which the
        ones sent begin."""
        calls = [(c.name, c.arguments) for c in self.tools.sendable(self.readers[index])]
        if finish:
            answered, finish = self.tools.answer(self.texts[index], finish)
            if answered is not None:
                calls = [(c.function.name, c.function.arguments) for c in answered]
        sent, deltas = self.sent[index], []
        for k, (name, arguments) in enumerate(calls):
            if k == len(sent):
                sent.append(0)
                deltas.append(ToolCallDelta(index=k, id=call_id(), type="function",
                                            function=FunctionCallDelta(name=name, arguments="")))
            if len(arguments) > sent[k]:
                deltas.append(ToolCallDelta(index=k, function=FunctionCallDelta(
                    arguments=arguments[sent[k]:])))
                sent[k] = len(arguments)
        shown = logprobs if self.want_logprobs else None
        out = [self._call(index, delta, shown if k == len(deltas) - 1 else None)
               for k, delta in enumerate(deltas)]
        if finish:
            out.append(responses.chat_chunk(*self.base, index, finish_reason=finish,
                                            logprobs=None if deltas else shown))
        elif not deltas:
            self.held[index] = ("", logprobs)
        return out

    def _content(self, index: int, text: str, logprobs: list[W.TokenLogprob]) -> list[dict]:
        if not text and not logprobs:
            return []
        return [responses.chat_chunk(*self.base, index, content=text,
                                     logprobs=logprobs if self.want_logprobs else None)]

    def _call(self, index: int, delta: ToolCallDelta,
              logprobs: list[W.TokenLogprob] | None = None) -> dict:
        return responses.chat_chunk(*self.base, index, tool_calls=[delta], logprobs=logprobs)

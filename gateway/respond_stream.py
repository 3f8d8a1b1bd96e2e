"""The Responses API's stream events from a chat stream's chunks (one sequence).

`response.created` and `response.in_progress` open the stream; text comes as a message item
(`output_item.added`, `content_part.added`, `output_text.delta`s, then the `.done` events),
function calls as function_call items (`output_item.added` with the name, then
`function_call_arguments.delta`s, each call done before the next begins); the last event,
`response.completed` (or `response.incomplete`, cut by max_output_tokens), carries the whole
response with its usage; a stream that breaks off ends with `error` (on which the SDKs raise),
then `response.failed`. With logprobs asked for, each text delta carries its tokens' logprobs
(a function call's are not returned, as OpenAI returns none).
"""

from __future__ import annotations

from gateway.errors import APIError
from gateway.respond import item_id
from openapi.responses import (
    IncompleteDetails,
    OutputFunctionCall,
    OutputMessage,
    OutputText,
    Response,
    ResponseError,
    ResponseUsage,
)


class ResponseEvents:
    def __init__(self, response: Response) -> None:
        self.response = response  # its id and settings; the output grows here
        self.sequence = 0
        self.calls: dict[int, OutputFunctionCall] = {}  # by the chat stream's call index
        self.open: OutputMessage | OutputFunctionCall | None = None
        self.finish: str | None = None

    def events(self, chunk: dict) -> list[dict]:
        choice = chunk["choices"][0]
        delta, out = choice["delta"], []
        if delta.get("role"):
            out += self._opening()
        logprobs = (choice.get("logprobs") or {}).get("content") or []
        calling = bool(self.calls or delta.get("tool_calls"))  # a call's logprobs: not kept
        if delta.get("content") or (logprobs and not calling):
            out += self._text(delta["content"] or "", logprobs)
        for call in delta.get("tool_calls") or []:
            out += self._call(call)
        if choice.get("finish_reason"):
            self.finish = choice["finish_reason"]
            out += self._close()
        return out

    def last(self, usage: ResponseUsage) -> dict:
        """`response.completed` or `response.incomplete`: the whole response."""
        cut = self.finish == "length"
        self.response.status = "incomplete" if cut else "completed"
        self.response.incomplete_details = IncompleteDetails(reason="max_output_tokens") \
            if cut else None
        self.response.usage = usage
        return self._event(f"response.{self.response.status}", response=self._dump())

    def failed(self, error: APIError) -> list[dict]:
        """`error` (with our code), then `response.failed`: the response as far as it got, its
        open item incomplete, its error in OpenAI's codes (OpenAI's pair; `response.created`
        first if nothing was sent yet)."""
        out = [] if self.sequence else self._opening()
        if self.open is not None:
            self.open.status = "incomplete"
            self.open = None
        self.response.status = "failed"
        self.response.error = ResponseError(
            code="rate_limit_exceeded" if error.status == 429 else "server_error",
            message=error.message)
        return [*out, self._event("error", code=error.code, message=error.message,
                                  param=error.param, error=error.body()["error"]),
                self._event("response.failed", response=self._dump())]

    def _opening(self) -> list[dict]:
        return [self._event("response.created", response=self._dump()),
                self._event("response.in_progress", response=self._dump())]

    def _text(self, text: str, logprobs: list[dict]) -> list[dict]:
        out = []
        if not isinstance(self.open, OutputMessage):
            out += self._close()
            self.open = OutputMessage(id=item_id("msg"), status="in_progress", content=[])
            out += self._added(self.open)
            self.open.content.append(OutputText(text=""))
            out.append(self._event("response.content_part.added", **self._at(self.open),
                                   content_index=0, part=OutputText(text="").model_dump()))
        self.open.content[0].text += text
        self.open.content[0].logprobs += logprobs
        out.append(self._event("response.output_text.delta", **self._at(self.open),
                               content_index=0, delta=text, logprobs=logprobs))
        return out

    def _call(self, delta: dict) -> list[dict]:
        out, function = [], delta.get("function") or {}
        if delta.get("id"):
            out += self._close()
            self.open = self.calls[delta["index"]] = OutputFunctionCall(
                id=item_id("fc"), call_id=delta["id"], name=function.get("name") or "",
                arguments="", status="in_progress")
            out += self._added(self.open)
        call = self.calls.get(delta["index"])
        if call is not None and function.get("arguments"):
            call.arguments += function["arguments"]
            out.append(self._event("response.function_call_arguments.delta", **self._at(call),
                                   delta=function["arguments"]))
        return out

    def _added(self, item: OutputMessage | OutputFunctionCall) -> list[dict]:
        self.response.output.append(item)
        return [self._event("response.output_item.added",
                            output_index=len(self.response.output) - 1, item=item.model_dump())]

    def _close(self) -> list[dict]:
        """The open item's `.done` events, its status final."""
        item, self.open = self.open, None
        if item is None:
            return []
        item.status = "incomplete" if self.finish == "length" else "completed"
        out = []
        if isinstance(item, OutputMessage):
            part = item.content[0]
            out += [self._event("response.output_text.done", **self._at(item), content_index=0,
                                text=part.text, logprobs=part.logprobs),
                    self._event("response.content_part.done", **self._at(item),
                                content_index=0, part=part.model_dump())]
        else:
            out.append(self._event("response.function_call_arguments.done", **self._at(item),
                                   name=item.name, arguments=item.arguments))
        index = self.response.output.index(item)
        return [*out, self._event("response.output_item.done", output_index=index,
                                  item=item.model_dump())]

    def _at(self, item: OutputMessage | OutputFunctionCall) -> dict:
        return {"item_id": item.id, "output_index": self.response.output.index(item)}

    def _dump(self) -> dict:
        return self.response.model_dump()

    def _event(self, kind: str, **fields) -> dict:
        event = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return event

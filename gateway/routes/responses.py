"""POST /v1/responses: the Responses API, served by the chat path (`gateway.respond`)."""

from __future__ import annotations

from fastapi import APIRouter, Request

from gateway.chat_stream import ChatStream
from gateway.deps import TenantDep
from gateway.errors import APIError, documented
from gateway.generation import Call, generate
from gateway.respond import as_chat, described, renamed, response, usage, wants_logprobs
from gateway.respond_stream import ResponseEvents
from gateway.routes.chat import prepared
from gateway.serving import PromptResult
from openapi.responses import Response, ResponseRequest
from wire import manager as W

router = APIRouter(prefix="/v1", tags=["responses"], responses=documented(400, 404, 429))


@router.post("/responses", response_model=Response)
async def create_response(body: ResponseRequest, request: Request, tenant: TenantDep):
    state = request.app.state
    target = state.serving.resolve(tenant, body.model, body.user or body.safety_identifier)
    chat = as_chat(body)
    try:
        params, tools, messages = prepared(chat, state.settings)
    except APIError as refused:
        raise renamed(refused) from None
    streams: dict[str, tuple[ChatStream, ResponseEvents]] = {}

    def make_body(call: Call, results: list[PromptResult]) -> dict:
        return response(call.response_id, call.created, body, results[0], tools).model_dump()

    def stream_of(call: Call) -> tuple[ChatStream, ResponseEvents]:
        if call.response_id not in streams:
            start = described(body, Response(id=call.response_id, created_at=call.created,
                                             status="in_progress", model=body.model,
                                             output=[]))
            streams[call.response_id] = (
                ChatStream((call.response_id, call.created, body.model), 1, tools,
                           wants_logprobs(body)),
                ResponseEvents(start))
        return streams[call.response_id]

    def events(call: Call, result: PromptResult, event: W.Message) -> list[dict]:
        chat_stream, response_events = stream_of(call)
        return [e for chunk in chat_stream.chunks(event) for e in response_events.events(chunk)]

    def last(call: Call, results: list[PromptResult]) -> dict:
        return stream_of(call)[1].last(usage(results[0]))

    return await generate(request, tenant, target, [{"messages": messages}], params,
                          prefix="resp_", stream=body.stream, include_usage=True,
                          body=make_body, chunks=events, usage_chunk=last,
                          user=body.user or body.safety_identifier, done_marker=False)

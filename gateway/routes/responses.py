"""/v1/responses: the Responses API, served by the chat path (`gateway.respond`); a response is
kept (`gateway.stored`) unless `store` is false, to go on from, read again or delete."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Query, Request

from gateway.chat_stream import ChatStream
from gateway.deps import TenantDep
from gateway.errors import APIError, documented
from gateway.generation import Call, generate
from gateway.records import change
from gateway.respond import (
    as_chat,
    described,
    input_items,
    renamed,
    response,
    usage,
    wants_logprobs,
)
from gateway.respond_stream import ResponseEvents
from gateway.routes.chat import prepared
from gateway.serving import PromptResult
from gateway.stored import found, keep, previous
from openapi.responses import DeletedResponse, Response, ResponseItemList, ResponseRequest
from wire import manager as W
from wire.store import StoreAction

router = APIRouter(prefix="/v1", tags=["responses"], responses=documented(400, 404, 429))


@router.post("/responses", response_model=Response)
async def create_response(body: ResponseRequest, request: Request, tenant: TenantDep):
    state = request.app.state
    target = state.serving.resolve(tenant, body.model, body.user or body.safety_identifier)
    before = previous(state.responses, tenant.id, body.previous_response_id)
    earlier = before.continued() if before else []
    chat = as_chat(body, earlier)
    try:
        params, tools, messages = prepared(chat, state.settings)
    except APIError as refused:
        raise renamed(refused) from None
    params.truncate = body.truncation == "auto"
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

    async def fail(call: Call, error: APIError) -> list[dict]:
        *first, failed = stream_of(call)[1].failed(error)
        return [*first, await settle(failed)]

    async def settle(answer: dict) -> dict:
        made = answer.get("response", answer)  # a stream's last event carries it
        if made["store"]:
            made["store"] = await keep(state.manager, tenant, made, earlier,
                                       input_items(body))
            state.metrics.stored.labels(tenant.id, str(made["store"]).lower()).inc()
        return answer

    return await generate(request, tenant, target, [{"messages": messages}], params,
                          prefix="resp_", stream=body.stream, include_usage=True,
                          body=make_body, chunks=events, usage_chunk=last,
                          user=body.user or body.safety_identifier, done_marker=False,
                          settle=settle, failed=fail)


@router.get("/responses/{response_id}", response_model=Response)
async def get_response(response_id: str, request: Request, tenant: TenantDep) -> dict:
    return found(request.app.state.responses, tenant.id, response_id).body


@router.delete("/responses/{response_id}", response_model=DeletedResponse)
async def delete_response(response_id: str, request: Request,
                          tenant: TenantDep) -> DeletedResponse:
    await change(request.app.state.manager, StoreAction.DELETE_RESPONSE, tenant.id,
                 param="response_id", response_id=response_id)  # the manager's 404 if none
    return DeletedResponse(id=response_id)


@router.get("/responses/{response_id}/input_items", response_model=ResponseItemList)
async def list_input_items(response_id: str, request: Request, tenant: TenantDep,
                           after: str | None = None,
                           limit: Annotated[int, Query(ge=1, le=100)] = 20,
                           order: Literal["asc", "desc"] = "desc") -> dict:
    """The items the response's request sent (`order` desc: the last first)."""
    made = found(request.app.state.responses, tenant.id, response_id)
    items, more = made.items(after=after, limit=limit, order=order)
    return {"object": "list", "data": items, "first_id": items[0]["id"] if items else None,
            "last_id": items[-1]["id"] if items else None, "has_more": more}

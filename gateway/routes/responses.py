"""/v1/responses: the Responses API, served by the chat path (`gateway.respond`); a response is
kept (`gateway.stored`) unless `store` is false, to go on from, read again or delete; one with
`background` is answered `queued` and run by `gateway.background`, and may be cancelled."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Annotated, Literal, NamedTuple

from fastapi import APIRouter, Query, Request
from fastapi.responses import StreamingResponse
from starlette.concurrency import run_in_threadpool
from starlette.convertors import Convertor, register_url_convertor

from gateway import obfuscation, stored
from gateway.background import RUN
from gateway.background_events import KEPT_S, Events
from gateway.chat_stream import ChatStream
from gateway.conversations import joined, settled, went_on
from gateway.deps import TenantDep
from gateway.errors import APIError, documented
from gateway.generation import Call, generate
from gateway.item_references import referred
from gateway.pages import page
from gateway.records import change
from gateway.respond import (
    as_chat,
    conversation_of,
    described,
    input_items,
    item_id,
    renamed,
    response,
    usage,
    wants_logprobs,
)
from gateway.respond_stream import ResponseEvents
from gateway.routes.chat import prepared
from gateway.serving import PromptResult, Target
from gateway.stored import found, previous
from gateway.tenants import Tenant
from gateway.tools import ToolMode
from gateway.turns import HELD, LOCKED
from openapi.responses import DeletedResponse, Response, ResponseItemList, ResponseRequest
from state.responses import StoredResponse
from wire import manager as W
from wire.store import StoreAction

log = logging.getLogger("gateway.responses")
router = APIRouter(prefix="/v1", tags=["responses"], responses=documented(400, 404, 429))


class ResponseId(Convertor[str]):
    """A response's id in a path: any segment but `input_tokens`, the count's (a GET there is
    a 405 naming POST, not a search for a response of that id)."""

    regex = r"(?!input_tokens(?:/|$))[^/]+"

    def convert(self, value: str) -> str:
        return value

    def to_string(self, value: str) -> str:
        return value


register_url_convertor("response_id", ResponseId())


@router.post("/responses", response_model=Response)
async def create_response(body: ResponseRequest, request: Request, tenant: TenantDep):
    state = request.app.state
    run = request.scope.get(RUN)  # (id, created_at): a background response's run
    target = state.serving.resolve(tenant, body.model, body.user or body.safety_identifier)
    if body.background and run is None:  # it takes its conversation's turn once it runs
        going = await run_in_threadpool(asked, state, tenant, body)
        made = await _queue(request, tenant, going.body, going.before, going.said)
        return _followed(state.background.events[made["id"]], None) if body.stream else made
    turn = request.scope.get(HELD) or _taken(state, tenant, body)
    try:
        return await _answer(request, tenant, body, target, turn)
    except BaseException:
        turn()
        raise


def _taken(state, tenant: Tenant, body: ResponseRequest) -> Callable[[], None]:
    """The turn of the conversation the response goes on in (nothing without one), and how to
    give it back; else the 400 `conversation_locked`."""
    if not (named := conversation_of(body)):
        return lambda: None
    try:
        return state.turns.take(tenant.id, named)
    except APIError:
        state.metrics.rejected.labels(tenant.id, LOCKED).inc()
        raise


async def _answer(request: Request, tenant: Tenant, body: ResponseRequest, target: Target,
                  turn: Callable[[], None]):
    """The response, generated (`turn` given back once it ends)."""
    state = request.app.state
    run = request.scope.get(RUN)
    body, talk, said, before, params, tools, messages = await run_in_threadpool(
        asked, state, tenant, body)
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
        if run is not None:
            _, added = await settled(state.manager, tenant, talk, made, input_items(body))
        else:
            added = await went_on(state.manager, tenant, talk, made, input_items(body))
        if added is not None:  # (before the answer shows)
            state.metrics.turns.labels(tenant.id, str(added).lower()).inc()
        if run is None and made["store"]:
            made["store"] = await stored.keep(state.manager, tenant, made, before,
                                              input_items(body), said)
            state.metrics.stored.labels(tenant.id, str(made["store"]).lower()).inc()
        return answer

    return await generate(request, tenant, target, [{"messages": messages}], params,
                          prefix="resp_", stream=body.stream, include_usage=True,
                          body=make_body, chunks=events, usage_chunk=last,
                          user=body.user or body.safety_identifier, done_marker=False,
                          settle=settle, failed=fail, named=run,
                          started=_started(state, tenant, body) if run else None,
                          obfuscate=obfuscation.wanted(body.stream_options), let_go=turn)


class Asked(NamedTuple):
    """A response request as it goes on: its input's references replaced by their items, the
    conversation it goes on in (its id and items) or the stored response before it, and its
    chat request's parameters, tools and messages."""

    body: ResponseRequest
    talk: str | None
    said: list
    before: StoredResponse | None
    params: W.SamplingParams
    tools: ToolMode
    messages: list[W.ChatMessage]


def asked(state, tenant: Tenant, body: ResponseRequest) -> Asked:
    """What a response request goes on from and its chat request (refused in the Responses
    API's names)."""
    talk, said = joined(state.conversations, tenant.id, body)
    before = previous(state.responses, tenant.id, body.previous_response_id)
    earlier = before.continued() if before else said
    body = referred(state, tenant.id, body, earlier)
    try:
        params, tools, messages = prepared(as_chat(body, earlier), state.settings)
    except APIError as refused:
        raise renamed(refused) from None
    params.truncate = body.truncation == "auto"
    return Asked(body, talk, said, before, params, tools, messages)


def _started(state, tenant: Tenant, body: ResponseRequest):
    async def started(call: Call) -> None:
        running = described(body, Response(id=call.response_id, created_at=call.created,
                                           status="in_progress", model=body.model, output=[]))
        try:
            await stored.settle(state.manager, tenant.id, running.model_dump())
        except APIError as exc:  # it runs on, shown queued until it ends
            log.warning("response %s not shown in progress: %s", call.response_id, exc.message)
    return started


async def _queue(request: Request, tenant: Tenant, body: ResponseRequest,
                 before: StoredResponse | None, said: list) -> dict:
    """The background response, `queued` and kept with its request, which
    `gateway.background` then runs."""
    state = request.app.state
    made = described(body, Response(id=item_id("resp"), created_at=int(time.time()),
                                    status="queued", model=body.model, output=[]))
    await stored.add(state.manager, tenant, made.model_dump(), before, input_items(body),
                     request=await request.json(), said=said)
    state.metrics.stored.labels(tenant.id, "true").inc()
    state.background.run(found(state.responses, tenant.id, made.id))
    return made.model_dump()


@router.post("/responses/{response_id:response_id}/cancel", response_model=Response,
             responses=documented(409))
async def cancel_response(response_id: str, request: Request, tenant: TenantDep) -> dict:
    """A background response still queued or in progress stops, `cancelled`; one cancelled
    before is as it was; one that ended otherwise is a 409."""
    state = request.app.state
    made = found(state.responses, tenant.id, response_id)
    if not made.body.get("background"):
        raise APIError(400, "Only responses created with background=true can be cancelled.",
                       "invalid_request", "response_id")
    if made.pending:
        cancelled = {**made.body, "status": "cancelled"}
        if await stored.settle(state.manager, tenant.id, cancelled):
            state.background.cancel(response_id)
            return cancelled
        made = found(state.responses, tenant.id, response_id)  # it ended meanwhile
    if made.pending or made.body["status"] != "cancelled":
        raise APIError(409, f"Cannot cancel a response that is {made.body['status']}.",
                       "invalid_request", "response_id")
    return made.body


@router.get("/responses/{response_id:response_id}", response_model=Response)
async def get_response(response_id: str, request: Request, tenant: TenantDep,
                       stream: bool = False,
                       starting_after: Annotated[int | None, Query(ge=-1)] = None):
    """The response as it is; with `stream`, a streamed background response's events past
    `starting_after` (all without it), then each as it comes until it ends."""
    made = await run_in_threadpool(found, request.app.state.responses, tenant.id, response_id,
                                   earlier=False)
    if not stream:
        return made.body
    if not (made.request or {}).get("stream"):
        raise APIError(400, "Only a response created with background=true and stream=true "
                       "can be streamed again.", "invalid_request", "stream")
    events = request.app.state.background.events.get(response_id)
    if events is None:
        raise APIError(400, f"The events of response '{response_id}' are no longer kept here "
                       f"(they are for {KEPT_S / 60:.0f} minutes after it ends, by the gateway "
                       "that ran it); read it whole without stream.", "invalid_request",
                       "stream")
    return _followed(events, starting_after)


def _followed(events: Events, after: int | None) -> StreamingResponse:
    return StreamingResponse(events.follow(after), media_type="text/event-stream",
                             headers={"cache-control": "no-cache"})


@router.delete("/responses/{response_id:response_id}", response_model=DeletedResponse)
async def delete_response(response_id: str, request: Request,
                          tenant: TenantDep) -> DeletedResponse:
    await change(request.app.state.manager, StoreAction.DELETE_RESPONSE, tenant.id,
                 param="response_id", response_id=response_id)  # the manager's 404 if none
    request.app.state.background.cancel(response_id)  # a background one stops running
    return DeletedResponse(id=response_id)


@router.get("/responses/{response_id:response_id}/input_items", response_model=ResponseItemList)
async def list_input_items(response_id: str, request: Request, tenant: TenantDep,
                           after: str | None = None,
                           limit: Annotated[int, Query(ge=1, le=100)] = 20,
                           order: Literal["asc", "desc"] = "desc") -> dict:
    """The items the response's request sent (`order` desc: the last first)."""
    made = await run_in_threadpool(found, request.app.state.responses, tenant.id, response_id,
                                   earlier=False)
    items, more = made.items(after=after, limit=limit, order=order)
    return page(items, more)

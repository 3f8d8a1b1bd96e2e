"""Stored chat completions (`store: true`): list them (by model and metadata), read one and the
messages it answered, give it new metadata, delete it; each tenant sees only its own."""

from __future__ import annotations

import json
from typing import Annotated, Literal

from fastapi import APIRouter, Query, Request

from gateway.deps import TenantDep
from gateway.errors import APIError, check_metadata, documented
from gateway.pages import page
from gateway.records import change
from gateway.stored_chat import found
from openapi.stored_chat import (
    ChatCompletionDeleted,
    ChatCompletionList,
    ChatCompletionUpdate,
    StoredChatCompletion,
    StoredMessageList,
)
from wire.store import StoreAction

router = APIRouter(prefix="/v1", tags=["chat"], responses=documented(400, 404))
Limit = Annotated[int, Query(ge=1, le=100)]
Order = Literal["asc", "desc"]


# The metadata filter is read from the query, not declared as a (deepObject) parameter: its
# values arrive as text, so no check could tell a string from how a null or a number is sent.
@router.get("/chat/completions", response_model=ChatCompletionList)
async def list_chat_completions(request: Request, tenant: TenantDep, model: str | None = None,
                                after: str | None = None, limit: Limit = 20,
                                order: Order = "asc") -> dict:
    """The stored completions, the oldest first (`order` desc: the newest), of `model` if
    named, and with every `metadata[key]=value` pair of the query in their metadata (at most
    16 pairs, keys <= 64 and values <= 512 characters)."""
    found_chats, more = request.app.state.chats.list(
        tenant.id, model=model, metadata=_metadata_filter(request), after=after, limit=limit,
        order=order)
    return page([chat.shown() for chat in found_chats], more)


@router.get("/chat/completions/{completion_id}", response_model=StoredChatCompletion)
async def get_chat_completion(completion_id: str, request: Request, tenant: TenantDep) -> dict:
    return found(request.app.state.chats, tenant.id, completion_id).shown()


@router.post("/chat/completions/{completion_id}", response_model=StoredChatCompletion)
async def update_chat_completion(completion_id: str, body: ChatCompletionUpdate,
                                 request: Request, tenant: TenantDep) -> dict:
    """Its metadata from now on (the only thing of it that can change)."""
    state = request.app.state
    check_metadata(body.metadata)
    found(state.chats, tenant.id, completion_id)  # a 404 names it before the manager is asked
    await change(state.manager, StoreAction.TAG_CHAT, tenant.id, param="completion_id",
                 record=json.dumps({"id": completion_id, "metadata": body.metadata or {}}))
    return found(state.chats, tenant.id, completion_id).shown()


@router.delete("/chat/completions/{completion_id}", response_model=ChatCompletionDeleted)
async def delete_chat_completion(completion_id: str, request: Request,
                                 tenant: TenantDep) -> ChatCompletionDeleted:
    await change(request.app.state.manager, StoreAction.DELETE_CHAT, tenant.id,
                 param="completion_id", response_id=completion_id)  # the manager's 404 if none
    return ChatCompletionDeleted(id=completion_id)


@router.get("/chat/completions/{completion_id}/messages", response_model=StoredMessageList)
async def list_chat_messages(completion_id: str, request: Request, tenant: TenantDep,
                             after: str | None = None, limit: Limit = 20,
                             order: Order = "asc") -> dict:
    """The messages the completion answered, as sent (`order` desc: the last first)."""
    made = found(request.app.state.chats, tenant.id, completion_id)
    return page(*made.messages_page(after=after, limit=limit, order=order))


def _metadata_filter(request: Request) -> dict[str, str]:
    """The query's `metadata[key]=value` pairs (OpenAI's form of a metadata filter)."""
    pairs = {name[len("metadata["):-1]: value
             for name, value in request.query_params.multi_items()
             if name.startswith("metadata[") and name.endswith("]")}
    if any(name == "metadata" or (name.startswith("metadata[") and not name.endswith("]"))
           for name in request.query_params):
        raise APIError(400, "Filter by metadata as metadata[key]=value, one pair a "
                       "parameter.", "invalid_request", "metadata")
    check_metadata(pairs)
    return pairs

"""/v1/conversations: OpenAI's Conversations API. A conversation is created (with its first
items and metadata), read, tagged anew and deleted; its items are added, listed, read and
deleted one by one; a response goes on in it with `conversation` (`gateway.conversations`).
Each tenant sees only its own."""

from __future__ import annotations

import json
import logging
import time
from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Query, Request

from gateway import respond
from gateway.conversations import found, new_items, shown
from gateway.deps import TenantDep
from gateway.errors import APIError, check_metadata, documented
from gateway.item_references import resolved
from gateway.pages import page
from gateway.records import change
from openapi.conversations import (
    LOGPROBS,
    Conversation,
    ConversationCreate,
    ConversationDeleted,
    ConversationItemList,
    ConversationUpdate,
    Include,
    ItemsCreate,
)
from openapi.items import InputItem
from wire.store import StoreAction

log = logging.getLogger("gateway.conversations")
router = APIRouter(prefix="/v1", tags=["conversations"], responses=documented(400, 404))


def included(request: Request, include: Annotated[Include | None, Query()] = None) -> list[str]:
    """`include`, also as the official SDK sends a list (`include[]=...`)."""
    brackets = request.query_params.getlist("include[]")
    for name in brackets:
        if name != LOGPROBS:
            raise APIError(400, f"Invalid value for 'include': {name!r} cannot be included "
                           f"here; only {LOGPROBS!r} can.", "invalid_value", "include")
    return [*(include or []), *brackets]


Included = Annotated[list[str], Depends(included)]


@router.post("/conversations", response_model=Conversation)
async def create_conversation(body: ConversationCreate, request: Request,
                              tenant: TenantDep) -> dict:
    state = request.app.state
    check_metadata(body.metadata)
    made = {"id": respond.item_id("conv"), "created_at": int(time.time()),
            "metadata": body.metadata or {},
            "items": new_items(resolved(state, tenant.id, body.items or [], [], "items"))}
    await change(state.manager, StoreAction.ADD_CONVERSATION, tenant.id,
                 record=json.dumps(made), quota_bytes=tenant.storage_quota())
    log.info("conversation %s created (%d items)%s", made["id"], len(made["items"]),
             f" for {body.safety_identifier!r}" if body.safety_identifier else "")
    return found(state.conversations, tenant.id, made["id"]).shown()


@router.get("/conversations/{conversation_id}", response_model=Conversation)
async def get_conversation(conversation_id: str, request: Request, tenant: TenantDep) -> dict:
    return found(request.app.state.conversations, tenant.id, conversation_id).shown()


@router.post("/conversations/{conversation_id}", response_model=Conversation)
async def update_conversation(conversation_id: str, body: ConversationUpdate, request: Request,
                              tenant: TenantDep) -> dict:
    """Its metadata from now on (its items change through `.../items`)."""
    state = request.app.state
    check_metadata(body.metadata)
    found(state.conversations, tenant.id, conversation_id)  # a 404 before the manager is asked
    await change(state.manager, StoreAction.TAG_CONVERSATION, tenant.id,
                 param="conversation_id",
                 record=json.dumps({"id": conversation_id, "metadata": body.metadata or {}}))
    return found(state.conversations, tenant.id, conversation_id).shown()


@router.delete("/conversations/{conversation_id}", response_model=ConversationDeleted)
async def delete_conversation(conversation_id: str, request: Request,
                              tenant: TenantDep) -> ConversationDeleted:
    """The conversation and its items (the responses that went on in it stay)."""
    await change(request.app.state.manager, StoreAction.DELETE_CONVERSATION, tenant.id,
                 param="conversation_id", response_id=conversation_id)
    return ConversationDeleted(id=conversation_id)


@router.post("/conversations/{conversation_id}/items", response_model=ConversationItemList,
              response_model_exclude_unset=True)
async def add_items(conversation_id: str, body: ItemsCreate, request: Request,
                    tenant: TenantDep, include: Included) -> dict:
    """The items added at its end, as kept (each with its id)."""
    state = request.app.state
    found(state.conversations, tenant.id, conversation_id)
    items = new_items(resolved(state, tenant.id, body.items, [], "items"))
    await change(state.manager, StoreAction.ADD_ITEMS, tenant.id, param="conversation_id",
                 quota_bytes=tenant.storage_quota(),
                 record=json.dumps({"conversation": conversation_id, "items": items}))
    return page([shown(item, include) for item in items], False)


@router.get("/conversations/{conversation_id}/items", response_model=ConversationItemList,
              response_model_exclude_unset=True)
async def list_items(conversation_id: str, request: Request, tenant: TenantDep,
                     include: Included, after: str | None = None,
                     limit: Annotated[int, Query(ge=1, le=100)] = 20,
                     order: Literal["asc", "desc"] = "desc") -> dict:
    """Its items, the last first (`order` asc: the first first)."""
    conversations = request.app.state.conversations
    found(conversations, tenant.id, conversation_id)
    items, more = conversations.page(conversation_id, tenant.id, after=after, limit=limit,
                                     order=order)
    return page([shown(item, include) for item in items], more)


@router.get("/conversations/{conversation_id}/items/{item_id}", response_model=InputItem,
              response_model_exclude_unset=True)
async def get_item(conversation_id: str, item_id: str, request: Request, tenant: TenantDep,
                   include: Included) -> dict:
    conversations = request.app.state.conversations
    found(conversations, tenant.id, conversation_id)
    item = conversations.item(conversation_id, tenant.id, item_id)
    if item is None:
        raise APIError(404, f"Item with id '{item_id}' not found.", "item_not_found", "item_id")
    return shown(item, include)


@router.delete("/conversations/{conversation_id}/items/{item_id}", response_model=Conversation)
async def delete_item(conversation_id: str, item_id: str, request: Request,
                      tenant: TenantDep) -> dict:
    """The conversation, without the item."""
    state = request.app.state
    found(state.conversations, tenant.id, conversation_id)
    await change(state.manager, StoreAction.DELETE_ITEM, tenant.id, param="item_id",
                 record=json.dumps({"conversation": conversation_id, "item": item_id}))
    return found(state.conversations, tenant.id, conversation_id).shown()

"""Stored chat completions, the gateway's side: a completion asked to be stored (`store: true`)
is kept by the worker manager with the messages it answered and its metadata before the client
has its answer (or its stream's end); one the manager cannot keep is logged, not the request's
failure, as OpenAI's dashboard store is no part of the answer."""

from __future__ import annotations

import json
import logging
from typing import Any

from gateway.errors import APIError
from gateway.manager_client import ManagerClient
from gateway.records import change
from gateway.tenants import Tenant
from openapi.chat import ChatCompletionRequest
from state.chat_completions import ChatReader, StoredChat
from wire.store import StoreAction

log = logging.getLogger("gateway.stored_chat")
KEEP_S = 5.0  # the longest a completion waits for the manager to keep it


async def keep(manager: ManagerClient, tenant: Tenant, body: dict[str, Any],
               request: ChatCompletionRequest) -> bool:
    """Whether the completion `body` is kept with the request's messages and metadata."""
    record = json.dumps({"body": body, "messages": stored_messages(body["id"], request),
                         "metadata": request.metadata or {}})
    try:
        await change(manager, StoreAction.ADD_CHAT, tenant.id, record=record, answer_s=KEEP_S,
                     quota_bytes=tenant.storage_quota())
    except APIError as exc:
        log.warning("chat completion %s was not stored: %s", body["id"], exc.message)
        return False
    return True


def stored_messages(chat_id: str, request: ChatCompletionRequest) -> list[dict[str, Any]]:
    """The request's messages as listed back: each with an id, its text as `content` and its
    parts (if it was sent as parts) as `content_parts`."""
    out = []
    for i, message in enumerate(request.messages):
        made = message.model_dump(exclude_none=True, exclude={"content"})
        made.update(id=f"{chat_id}-{i}", content=message.content_text(), content_parts=[
            part.model_dump() for part in message.content] if isinstance(message.content, list)
            else None)
        out.append(made)
    return out


def found(chats: ChatReader, tenant: str, chat_id: str) -> StoredChat:
    made = chats.get(chat_id, tenant)
    if made is None:
        raise APIError(404, f"Chat completion with id '{chat_id}' not found.",
                       "chat_completion_not_found", "completion_id")
    return made

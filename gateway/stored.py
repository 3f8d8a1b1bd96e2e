"""Stored responses, the gateway's side: the response a request goes on from
(`previous_response_id`), and its answer kept by the worker manager (unless `store` is false,
as OpenAI's default) with the conversation it answered, before the client has the answer."""

from __future__ import annotations

import json
import logging
from typing import Any

from gateway.errors import APIError
from gateway.manager_client import ManagerClient
from gateway.records import change
from gateway.respond import item_id
from gateway.tenants import Tenant
from openapi.items import FunctionCallItem, MessageItem
from state.responses import ResponseReader, StoredResponse
from wire.store import StoreAction

log = logging.getLogger("gateway.stored")
KEEP_S = 5.0  # the longest a response waits for the manager to keep it


def previous(responses: ResponseReader, tenant: str, response_id: str | None) -> \
        StoredResponse | None:
    if response_id is None:
        return None
    found = responses.get(response_id, tenant)
    if found is None:
        raise APIError(404, f"Previous response with id '{response_id}' not found.",
                       "previous_response_not_found", "previous_response_id")
    if found.pending:
        raise APIError(400, f"Previous response '{response_id}' is still "
                       f"{found.body['status']} (a background response); go on from it once "
                       "it has completed.", "invalid_request", "previous_response_id")
    return found


def found(responses: ResponseReader, tenant: str, response_id: str, *,
          earlier: bool = True) -> StoredResponse:
    made = responses.get(response_id, tenant, earlier=earlier)
    if made is None:
        raise not_found(response_id)
    return made


def not_found(response_id: str) -> APIError:
    return APIError(404, f"Response with id '{response_id}' not found.", "response_not_found",
                    "response_id")


async def keep(manager: ManagerClient, tenant: Tenant, response: dict[str, Any],
               before: StoredResponse | None, own: list, said: list | None = None) -> bool:
    """Whether `response` (a Response's JSON) is kept with its conversation: what the response
    it went on from (`before`) continued, or the items of the conversation it went on in
    (`said`), and the request's `own` items. A manager that cannot keep it (or a tenant whose
    storage quota it would pass) is logged, not the request's failure: the response then says
    `store: false`."""
    try:
        await add(manager, tenant, response, before, own, said=said)
    except APIError as exc:
        log.warning("response %s was not stored: %s", response["id"], exc.message)
        return False
    return True


async def add(manager: ManagerClient, tenant: Tenant, response: dict[str, Any],
              before: StoredResponse | None, own: list,
              request: dict[str, Any] | None = None, said: list | None = None) -> None:
    """`response` kept with its conversation, and for a background one (queued) the
    `request` that runs it; else the manager's refusal (`keep`: logged instead). The whole
    conversation goes with it: the manager keeps only the `own` items and a link while the
    response it went on from is kept (`workers.manager.response_store`)."""
    earlier = before.continued() if before else said or []
    conversation = [*earlier, *(stored_item(item) for item in own)]
    record = json.dumps({"id": response["id"], "created_at": response["created_at"],
                         "body": response, "conversation": conversation, "own": len(own),
                         "previous": before.id if before else None, "request": request})
    await change(manager, StoreAction.ADD_RESPONSE, tenant.id, record=record,
                 answer_s=KEEP_S, quota_bytes=tenant.storage_quota())


async def settle(manager: ManagerClient, tenant: str, response: dict[str, Any]) -> bool:
    """Whether the background response was still pending and is now as `response` has it
    (else it ended before: cancelled, or settled by another run); kept whatever it takes;
    APIError where the manager cannot say."""
    answer = await change(manager, StoreAction.SETTLE_RESPONSE, tenant,
                          record=json.dumps(response), answer_s=KEEP_S)
    return bool(answer.made)


def stored_item(item: Any, fresh: bool = False) -> dict[str, Any]:
    """An input item as kept and listed: with an id (the one it came with, unless `fresh`) and
    a status, a message's text as parts (an assistant's text with its annotations, none)."""
    made = item.model_dump(exclude_none=True)
    if isinstance(item, MessageItem):
        prefix = "msg"
        if isinstance(item.content, str):
            kind = "output_text" if item.role == "assistant" else "input_text"
            made["content"] = [{"type": kind, "text": item.content}]
        for part in made["content"]:
            if part["type"] == "output_text":
                part.setdefault("annotations", [])
    else:
        prefix = "fc" if isinstance(item, FunctionCallItem) else "fco"
    made["id"] = item_id(prefix) if fresh else made.get("id") or item_id(prefix)
    made.setdefault("status", "completed")
    return made

"""Conversations, the gateway's side: the conversation a response goes on in (`conversation`),
and its input and output added to it once the response is done, by the worker manager (their
one writer), before the client has the answer."""

from __future__ import annotations

import json
import logging
from typing import Any

from gateway.errors import APIError
from gateway.manager_client import ManagerClient
from gateway.records import change
from gateway.respond import conversation_of
from gateway.stored import KEEP_S, settle, stored_item
from gateway.tenants import Tenant
from openapi.conversations import LOGPROBS
from state.conversations import ConversationReader, StoredConversation
from wire.store import StoreAction

log = logging.getLogger("gateway.conversations")
DONE = ("completed", "incomplete")  # a response's ends that go into its conversation


def found(conversations: ConversationReader, tenant: str, conversation_id: str,
          param: str = "conversation_id") -> StoredConversation:
    made = conversations.get(conversation_id, tenant)
    if made is None:
        raise APIError(404, f"Conversation with id '{conversation_id}' not found.",
                       "conversation_not_found", param)
    return made


def joined(conversations: ConversationReader, tenant: str, body: Any) -> \
        tuple[str | None, list[dict[str, Any]]]:
    """The conversation a response request goes on in (its id; None without one) and its
    items, the first first."""
    if body.conversation is None:
        return None, []
    if body.previous_response_id is not None:
        raise APIError(400, "Mutually exclusive parameters: give 'previous_response_id' or "
                       "'conversation', not both.", "invalid_request", "conversation")
    named = conversation_of(body)
    found(conversations, tenant, named, "conversation")
    return named, conversations.items(named, tenant)


def new_items(items: list) -> list[dict[str, Any]]:
    """Items as a conversation keeps them: each with an id made here (an item sent back with
    the id it was read with would otherwise be there twice) and a status."""
    return [stored_item(item, fresh=True) for item in items]


def shown(item: dict[str, Any], include: list[str]) -> dict[str, Any]:
    """An item as read back: the logprobs of an assistant's text only where included."""
    if LOGPROBS in include or item.get("type") != "message":
        return item
    return {**item, "content": [{**part, "logprobs": []} if part.get("logprobs") else part
                                for part in item["content"]]}


async def extend(manager: ManagerClient, tenant: Tenant, conversation_id: str,
                 items: list[dict[str, Any]]) -> None:
    """`items` added at the end of the conversation; else the manager's refusal."""
    await change(manager, StoreAction.ADD_ITEMS, tenant.id, param="conversation_id",
                 answer_s=KEEP_S, quota_bytes=tenant.storage_quota(),
                 record=json.dumps({"conversation": conversation_id, "items": items}))


async def went_on(manager: ManagerClient, tenant: Tenant, conversation_id: str | None,
                  response: dict[str, Any], sent: list) -> bool | None:
    """Whether a done response's input (`sent`) and output were added to the conversation it
    went on in (None: it went on in none, or is not done); one that cannot be added (the
    conversation deleted meanwhile, the tenant's quota) is logged, not the request's
    failure."""
    if (items := _turn(conversation_id, response, sent)) is None:
        return None
    try:
        await extend(manager, tenant, conversation_id, items)
    except APIError as exc:
        log.warning("response %s was not added to conversation %s: %s", response["id"],
                    conversation_id, exc.message)
        return False
    return True


async def settled(manager: ManagerClient, tenant: Tenant, conversation_id: str | None,
                  response: dict[str, Any], sent: list) -> tuple[bool, bool | None]:
    """A background response's end: whether it settled as `response` has it (else it had
    ended before, cancelled) and whether its turn was added to the conversation it went on in
    (None: in none, not done, or not settled). Both are one change of the manager's, so that a
    cancel that comes first leaves the conversation as it was, and a poller never sees it done
    with its turn missing."""
    if (items := _turn(conversation_id, response, sent)) is None:
        return await settle(manager, tenant.id, response), None
    answer = await change(manager, StoreAction.SETTLE_TURN, tenant.id, answer_s=KEEP_S,
                          quota_bytes=tenant.storage_quota(),
                          record=json.dumps({"response": response,
                                             "conversation": conversation_id, "items": items}))
    if answer.made and not answer.added:
        log.warning("response %s was not added to conversation %s (gone, or past the quota)",
                    response["id"], conversation_id)
    return bool(answer.made), answer.added if answer.made else None


def _turn(conversation_id: str | None, response: dict[str, Any], sent: list) -> \
        list[dict[str, Any]] | None:
    """What a response adds to the conversation it went on in: its input (`sent`, each item
    with an id of its own), then its output; None where it went on in none or is not done."""
    if conversation_id is None or response["status"] not in DONE:
        return None
    return [*new_items(sent), *response["output"]]

"""Input items given by reference (`{"type": "item_reference", "id": ...}`, as OpenAI's Responses
API takes them): each is the item of that id, found in what the request goes on from (its
conversation's items, or the stored response's conversation and output), else in any of the
tenant's conversations, else among the items its stored responses keep. One found nowhere is a
404 naming its place in `input`."""

from __future__ import annotations

from typing import Any

from pydantic import TypeAdapter, ValidationError

from gateway.errors import APIError
from openapi.items import InputItem, ItemReference
from openapi.responses import ResponseRequest

ITEM = TypeAdapter(InputItem)


def referred(state, tenant: str, body: ResponseRequest,
             earlier: list[dict[str, Any]]) -> ResponseRequest:
    """`body` with each item reference in its input replaced by the item it names."""
    if isinstance(body.input, str) or \
            not any(isinstance(item, ItemReference) for item in body.input):
        return body
    known = {item.get("id"): item for item in earlier}
    return body.model_copy(update={"input": [
        _found(state, tenant, item, known, f"input[{k}]")
        if isinstance(item, ItemReference) else item for k, item in enumerate(body.input)]})


def _found(state, tenant: str, reference: ItemReference, known: dict[str, dict],
           param: str) -> Any:
    made = known.get(reference.id) or state.conversations.found_item(tenant, reference.id) or \
        state.responses.found_item(tenant, reference.id)
    if made is None:
        raise APIError(404, f"Item with id '{reference.id}' not found.", "item_not_found",
                       param)
    try:
        return ITEM.validate_python(made)
    except ValidationError:  # kept, but of a kind that cannot be sent back
        raise APIError(400, f"Item with id '{reference.id}' cannot be sent as input.",
                       "invalid_request", param) from None

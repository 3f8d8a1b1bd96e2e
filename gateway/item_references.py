"""Items given by reference (`{"type": "item_reference", "id": ...}`, as OpenAI's Responses and
Conversations APIs take them): each is the item of that id, found in what the request goes on
from (a response's conversation, or the stored response before it), else in any of the
tenant's conversations, else among the items its stored responses keep. One found nowhere is a
404 naming its place (`input[i]`, `items[i]`)."""

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
    if isinstance(body.input, str):
        return body
    items = resolved(state, tenant, body.input, earlier, "input")
    return body if items is body.input else body.model_copy(update={"input": items})


def resolved(state, tenant: str, items: list, earlier: list[dict[str, Any]],
             param: str) -> list:
    """`items` (those of the field `param`) with each reference replaced by the item it
    names, first looked for in `earlier`; `items` itself where there is none."""
    if not any(isinstance(item, ItemReference) for item in items):
        return items
    known = {item.get("id"): item for item in earlier}
    return [_found(state, tenant, item, known, f"{param}[{k}]")
            if isinstance(item, ItemReference) else item for k, item in enumerate(items)]


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

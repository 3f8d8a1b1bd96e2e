"""A list answer as OpenAI gives one: a page of objects (each with an `id`), the first's and
the last's ids (None when empty) and whether more follow."""

from __future__ import annotations

from typing import Any


def page(data: list[dict[str, Any]], more: bool) -> dict[str, Any]:
    return {"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None, "has_more": more}

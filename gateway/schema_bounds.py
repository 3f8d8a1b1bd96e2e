"""The published OpenAPI document made exact: integer bounds, and forms closed to fields their
routes do not take (`gateway.deps.known_form_fields` refuses them)."""

from __future__ import annotations

EXACT = {float(v): v for v in (2**63 - 1, -(2**63))}  # int64 bounds a float cannot hold


def exact_bounds(node: object) -> object:
    """The document with integer bounds exact: FastAPI's OpenAPI models hold `minimum` and
    `maximum` as floats, and float(2**63 - 1) is 2**63 (a seed one past the range would look
    schema-valid)."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("minimum", "maximum") and value in EXACT and isinstance(value, float):
                node[key] = EXACT[value]
            else:
                exact_bounds(value)
    elif isinstance(node, list):
        for value in node:
            exact_bounds(value)
    return node


def closed_forms(document: dict) -> dict:
    """Every form body's schema (FastAPI's `Body_...`) with no properties beyond its own."""
    for name, schema in document.get("components", {}).get("schemas", {}).items():
        if name.startswith("Body_"):
            schema["additionalProperties"] = False
    return document


def upload_limit(document: dict, max_upload_bytes: int) -> dict:
    """An upload's `bytes` bounded by the largest file this gateway takes (a setting)."""
    schema = document.get("components", {}).get("schemas", {}).get("UploadRequest")
    if schema is not None:
        schema["properties"]["bytes"]["maximum"] = max_upload_bytes
    return document

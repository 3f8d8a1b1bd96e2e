"""OpenAI's published API spec (`tests/data/openai-openapi-subset.yaml`) read as JSON Schema, the
independent reference for the shapes of our requests and answers.

The file is OpenAPI 3.1 with some 3.0 leftovers that JSON Schema 2020-12 reads otherwise:
`nullable: true` (here: the value may also be null) and a boolean `exclusiveMinimum` beside its
`minimum` (here: the bound itself is excluded)."""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any

import yaml
from jsonschema import Draft202012Validator
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

SPEC = Path(__file__).parent / "data" / "openai-openapi-subset.yaml"
BASE = "urn:openai-spec"


def _as_json_schema(node: Any) -> Any:
    if isinstance(node, list):
        return [_as_json_schema(item) for item in node]
    if not isinstance(node, dict):
        return node
    node = {key: _as_json_schema(value) for key, value in node.items()}
    for side, bound in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
        if isinstance(node.get(side), bool):
            excluded = node.pop(side)
            if excluded and bound in node:
                node[side] = node.pop(bound)
    if node.pop("nullable", False):
        return {"anyOf": [node, {"type": "null"}]}
    return node


@functools.cache
def spec() -> dict:
    return _as_json_schema(yaml.safe_load(SPEC.read_text()))


def schemas() -> dict:
    return spec()["components"]["schemas"]


@functools.cache
def _registry() -> Registry:
    return Registry().with_resource(BASE, Resource.from_contents(spec(),
                                                                 default_specification=DRAFT202012))


def violations(schema: str, instance: Any) -> list[str]:
    """Where `instance` breaks OpenAI's component `schema` (empty: it conforms)."""
    validator = Draft202012Validator({"$ref": f"{BASE}#/components/schemas/{schema}"},
                                     registry=_registry())
    return [f"{schema} at {list(error.absolute_path)}: {error.message[:300]}"
            for error in validator.iter_errors(instance)]


def operations() -> dict[tuple[str, str], str | None]:
    """(METHOD, path with its parameters as {}) -> the component its 200 JSON answer is (None:
    not a component)."""
    found = {}
    for path, methods in spec()["paths"].items():
        for method, operation in methods.items():
            if method not in ("get", "post", "delete"):
                continue
            answer = operation.get("responses", {}).get("200", {}).get("content", {})
            ref = answer.get("application/json", {}).get("schema", {}).get("$ref", "")
            found[(method.upper(), re.sub(r"\{[^}]*\}", "{}", path))] = \
                ref.rsplit("/", 1)[-1] or None
    return found

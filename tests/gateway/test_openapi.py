"""The committed OpenAPI document is the app's own; our paths are OpenAI's, and so are our
completion and chat requests' fields and the values they accept, and the fields the official
SDK sends to the Responses and Conversations APIs."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable

from openai.types.conversations.conversation_create_params import ConversationCreateParams
from openai.types.conversations.conversation_update_params import ConversationUpdateParams
from openai.types.conversations.item_create_params import ItemCreateParams
from openai.types.conversations.item_list_params import ItemListParams
from openai.types.conversations.item_retrieve_params import ItemRetrieveParams
from openai.types.responses.input_token_count_params import InputTokenCountParams
from openai.types.responses.response_create_params import ResponseCreateParamsBase

from gateway.openapi_export import DOCUMENT, render
from openapi.conversations import ConversationCreate, ConversationUpdate, ItemsCreate
from openapi.input_tokens import InputTokensRequest
from openapi.responses import ResponseRequest
from tests.openai_spec import SPEC, schemas


def test_committed_document_matches_the_app() -> None:
    fresh = DOCUMENT.read_text() == render()  # (pytest's diff of two big strings takes minutes)
    assert fresh, "openapi/openapi.json is stale: run `python -m gateway.openapi_export`"


def test_openai_paths_are_served_under_v1() -> None:
    ours = set(json.loads(DOCUMENT.read_text())["paths"])
    theirs = set(re.findall(r"^  (/[a-z_/{}]+):\s*$", SPEC.read_text(), re.MULTILINE))
    assert theirs, "could not read OpenAI's spec"
    for path in ("/completions", "/chat/completions", "/models", "/models/{model}"):
        assert path in theirs
        assert f"/v1{path}" in ours


# Where our contract accepts less than OpenAI's, and why: (our schema, field, bound) -> ours.
NARROWER = {("CompletionRequest", "best_of", "minimum"): 1}  # best_of counts n (>= 1) in


def _bounds(schema: dict, resolve) -> dict[str, float]:
    """A field's numeric bounds, from it or its anyOf / oneOf alternatives (a nullable field)."""
    keys = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")
    schema = resolve(schema)
    found = {k: float(schema[k]) for k in keys if k in schema}  # (OpenAI's int64 bounds are
    for alternative in schema.get("anyOf", []) + schema.get("oneOf", []):  # JSON's rounded)
        alternative = resolve(alternative)
        found.update({k: float(alternative[k]) for k in keys if k in alternative})
    return found


def _schemas() -> tuple[dict, dict]:
    return schemas(), json.loads(DOCUMENT.read_text())["components"]["schemas"]


def resolver(named: dict) -> Callable[[dict], dict]:
    """A `$ref` to one of `named` (a spec's components) as the schema it names."""
    return lambda node: named[node["$ref"].rsplit("/", 1)[-1]] if "$ref" in node else node


def _fields(schema: dict, resolve) -> dict[str, dict]:
    schema, fields = resolve(schema), {}
    for part in schema.get("allOf", []):
        fields.update(_fields(part, resolve))
    return {**fields, **schema.get("properties", {})}


def test_every_value_openai_accepts_for_a_sampling_field_is_accepted_here() -> None:
    """OpenAI's ranges for the completion and chat requests' numeric fields (their spec's
    subset) lie within ours: a client's valid value (top_p 0, n 16) is never our 400, except
    where `NARROWER` says why."""
    theirs, ours = _schemas()
    checked = []
    for their_name, our_name in (("CreateCompletionRequest", "CompletionRequest"),
                                 ("CreateChatCompletionRequest", "ChatCompletionRequest")):
        our_fields = ours[our_name]["properties"]
        for field, spec in _fields(theirs[their_name], resolver(theirs)).items():
            their = _bounds(spec, resolver(theirs))
            if field not in our_fields or not their:
                continue
            our = _bounds(our_fields[field], resolver(ours))
            low = their.get("minimum", their.get("exclusiveMinimum"))
            high = their.get("maximum", their.get("exclusiveMaximum"))
            if low is not None:
                allowed = NARROWER.get((our_name, field, "minimum"), low)
                assert our.get("minimum", -math.inf) <= allowed and \
                    our.get("exclusiveMinimum", -math.inf) < allowed, (our_name, field, our)
            if high is not None:
                assert our.get("maximum", math.inf) >= high and \
                    our.get("exclusiveMaximum", math.inf) > high, (our_name, field, our)
            checked.append(field)
    assert {"top_p", "n", "temperature", "best_of", "top_logprobs"} <= set(checked)


def test_every_field_openai_names_is_served_or_refused_by_name() -> None:
    """A field of OpenAI's completion or chat request is ours: served, or refused with the
    reason (`gateway.sampling.UNSUPPORTED`), never an 'unrecognized argument'."""
    theirs, ours = _schemas()
    for their_name, our_name in (("CreateCompletionRequest", "CompletionRequest"),
                                 ("CreateChatCompletionRequest", "ChatCompletionRequest")):
        named = set(_fields(theirs[their_name], resolver(theirs)))
        assert len(named) > 15 and named - set(ours[our_name]["properties"]) == set(), our_name


def test_every_field_the_sdk_sends_to_the_responses_api_is_served_or_refused_by_name() -> None:
    """OpenAI's spec subset lacks the Responses API: the official SDK's request type stands in
    (`gateway.respond.UNSUPPORTED` gives the refused fields' reasons)."""
    named = set(ResponseCreateParamsBase.__annotations__)
    assert len(named) > 30 and named - set(ResponseRequest.model_fields) == set()


def test_every_field_the_sdk_sends_to_count_input_tokens_is_ours() -> None:
    """`client.responses.input_tokens.count`'s fields, each served or refused by name; each
    is a field of the response request too (the count is of the same request's input)."""
    named = set(InputTokenCountParams.__annotations__)
    assert len(named) > 10 and named - set(InputTokensRequest.model_fields) == set()
    assert set(InputTokensRequest.model_fields) - {"personality"} <= \
        set(ResponseRequest.model_fields)


def test_every_field_and_query_the_sdk_sends_to_the_conversations_api_is_ours() -> None:
    """The conversations' and their items' requests: each body field a model's, each query
    parameter (the items' list and reads) one of the routes'."""
    assert set(ConversationCreateParams.__annotations__) == \
        set(ConversationCreate.model_fields)
    assert set(ConversationUpdateParams.__annotations__) == \
        set(ConversationUpdate.model_fields)
    assert set(ItemCreateParams.__annotations__) - {"include"} == set(ItemsCreate.model_fields)
    paths = json.loads(DOCUMENT.read_text())["paths"]
    items = "/v1/conversations/{conversation_id}/items"

    def query(path: str, method: str) -> set[str]:
        return {p["name"] for p in paths[path][method].get("parameters", [])
                if p["in"] == "query"}

    assert query(items, "get") == set(ItemListParams.__annotations__)
    assert query(items, "post") == {"include"}
    assert query(items + "/{item_id}", "get") == \
        set(ItemRetrieveParams.__annotations__) - {"conversation_id"}

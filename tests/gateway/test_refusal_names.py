"""What a refusal names: the field in question, inside a union's member where one member got
further (a list item's field, a model member's field, never pydantic's member or tag names), and
every member's wish where the field itself is in question; a query parameter by its name."""

from __future__ import annotations

import pytest

from tests.gateway.conftest import KEY
from tests.gateway.test_validation import CHAT, COMPLETION, TOOL, assert_openai_error

RESPONSE = {"model": "tiny-llama", "input": "Hi"}
UNIONS = [  # a field that takes one of several types: every member's demand is named
    ("/v1/fine_tuning/jobs", {"model": "tiny-llama", "training_file": "file-x",
                              "hyperparameters": {"n_epochs": 0}}, "hyperparameters.n_epochs",
     "Input should be 'auto' or greater than or equal to 1"),
    ("/v1/fine_tuning/jobs", {"model": "tiny-llama", "training_file": "file-x", "method": {
        "type": "supervised", "supervised": {"hyperparameters": {"batch_size": 10**6}}}},
     "method.supervised.hyperparameters.batch_size",
     "Input should be 'auto' or less than or equal to 256"),
    ("/v1/chat/completions", {**CHAT, "stop": 5}, "stop",
     "Input should be a valid string or a valid list"),
    ("/v1/chat/completions", {**CHAT, "tools": [TOOL], "tool_choice": "sometimes"},
     "tool_choice", "Input should be 'none', 'auto' or 'required' or an object"),
    ("/v1/completions", {**COMPLETION, "prompt": [1.5]}, "prompt.0",
     "Input should be a valid string or a valid integer or a valid list"),
    ("/v1/completions", {**COMPLETION, "prompt": [1, "a"]}, "prompt",
     "Input should be a valid string or a valid list"),  # no one item is wrong
    # a member that got further names the field inside it (not the union's member or tag)
    ("/v1/chat/completions", {**CHAT, "messages": [{"role": "function", "content": "x"}]},
     "messages.0.role", "Input should be 'system', 'developer', 'user', 'assistant' or 'tool'"),
    ("/v1/chat/completions", {**CHAT, "messages": [{"role": "user", "content": [
        {"type": "text", "text": "a"}, {"type": "input_audio", "input_audio": {}}]}]},
     "messages.0.content.1.type",
     "Input should be 'text' (or, in an assistant message, 'refusal')"),
    ("/v1/chat/completions", {**CHAT, "response_format": {"type": "json_schema",
                                                          "json_schema": {"schema": {}}}},
     "response_format.json_schema.name", "Field required"),
    ("/v1/chat/completions", {**CHAT, "tools": [TOOL], "tool_choice": {
        "type": "function", "function": {}}}, "tool_choice.function.name", "Field required"),
    *(("/v1/responses", {**RESPONSE, "input": [{"type": kind, "call_id": "0", "output": ""}]},
       "input.0.type",
       "Input should be 'message', 'function_call', 'function_call_output' or 'item_reference'")
      for kind in ({}, [], "input_image")),  # an unhashable type once raised (a 500)
    *(("/v1/responses", {**RESPONSE, "input": [{"role": "user", "content": [
        {"type": kind, "image_url": "https://example.com/a.png"}]}]},
       "input.0.content.0.type", "Input should be 'input_text', 'output_text' or 'refusal'")
      for kind in ("input_image", {}, [])),
    *(("/v1/chat/completions", {**CHAT, "messages": [{"role": "assistant", "content": [
        {"type": kind, "text": "x"}]}]},
       "messages.0.content.0.type", "Input should be 'text' (or, in an assistant message, "
       "'refusal')") for kind in ("image_url", {}, [])),
    ("/v1/responses", {**RESPONSE, "input": [{"type": "function_call", "call_id": "c",
                                              "arguments": "{}"}]},
     "input.0.name", "Field required"),
    ("/v1/responses", {**RESPONSE, "text": {"format": {"type": "json_schema", "schema": {}}}},
     "text.format.name", "Field required"),
]


@pytest.mark.parametrize(("path", "body", "param", "says"), UNIONS,
                         ids=[param for _, _, param, _ in UNIONS])
def test_a_union_field_says_what_each_of_its_types_takes(client, path: str, body: dict,
                                                         param: str, says: str) -> None:
    error = assert_openai_error(client.post(path, json=body, headers=KEY), 400)
    assert error["param"] == param
    assert error["message"] == f"Invalid value for '{param}': {says}"



@pytest.mark.parametrize("listing", ["/v1/files", "/v1/fine_tuning/jobs"])
def test_a_cursor_that_names_nothing_in_the_list_is_refused(client, listing: str) -> None:
    """Not read as the end of the list (jobs said so) or as its start (files restarted)."""
    error = assert_openai_error(client.get(f"{listing}?after=nothing-1", headers=KEY), 404)
    assert error["param"] == "after" and "'nothing-1', which is not in this list" in \
        error["message"]


@pytest.mark.parametrize(("query", "param", "says"), [
    ("/v1/files?limit=0", "limit", "Input should be greater than or equal to 1"),
    ("/v1/files?order=sideways", "order", "Input should be 'asc' or 'desc'"),
    ("/v1/fine_tuning/jobs?limit=1000", "limit", "Input should be less than or equal to 100"),
])
def test_a_query_parameter_is_named_as_the_client_wrote_it(client, query: str, param: str,
                                                           says: str) -> None:
    error = assert_openai_error(client.get(query, headers=KEY), 400)
    assert error["param"] == param
    assert error["message"] == f"Invalid value for '{param}': {says}"


@pytest.mark.parametrize(("content", "headers", "says"), [
    (b"[1, 2]", {"Content-Type": "application/json"}, "is not a JSON object"),
    (b"null", {"Content-Type": "application/json"}, "is not a JSON object"),
    (b'{"model": "tiny-llama"}', {"Content-Type": "text/plain"}, "is not a JSON object"),
    (b"", {"Content-Type": "application/json"}, "is missing"),
])
def test_a_body_that_is_no_object_is_told_so_not_a_field(client, content: bytes,
                                                         headers: dict, says: str) -> None:
    response = client.post("/v1/chat/completions", content=content, headers={**KEY, **headers})
    error = assert_openai_error(response, 400)
    assert error["param"] is None
    assert error["message"] == f"The request body {says}: send one, with Content-Type: " \
        "application/json."


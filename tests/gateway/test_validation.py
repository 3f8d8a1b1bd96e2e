"""Bad requests get 4xx OpenAI-shaped errors, never a 500 or a stack trace."""

from __future__ import annotations

import json

import pytest

from catalogue.resolve import resolve_model
from tests.gateway.conftest import KEY

COMPLETION = {"model": "tiny-llama", "prompt": "hi"}
CHAT = {"model": "tiny-llama", "messages": [{"role": "user", "content": "hi"}]}
TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}

BAD = [
    ("/v1/completions", {**COMPLETION, "max_tokens": -1}, "max_tokens"),
    ("/v1/completions", {**COMPLETION, "max_tokens": "ten"}, "max_tokens"),
    ("/v1/completions", {**COMPLETION, "n": 129}, "n"),
    ("/v1/completions", {**COMPLETION, "n": 0}, "n"),
    ("/v1/completions", {**COMPLETION, "temperature": 3}, "temperature"),
    ("/v1/completions", {**COMPLETION, "top_p": -0.01}, "top_p"),
    ("/v1/completions", {**COMPLETION, "best_of": 21, "n": 2}, "best_of"),
    ("/v1/completions", {**COMPLETION, "logprobs": 6}, "logprobs"),
    ("/v1/completions", {**COMPLETION, "stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ("/v1/completions", {**COMPLETION, "stop": 5}, "stop"),
    ("/v1/completions", {**COMPLETION, "prompt": []}, "prompt"),
    ("/v1/completions", {**COMPLETION, "prompt": [1, "a"]}, "prompt"),
    ("/v1/completions", {"prompt": "hi"}, "model"),
    ("/v1/completions", {**COMPLETION, "messages": []}, "messages"),
    ("/v1/completions", {**COMPLETION, "stream_options": {"include_usage": True, "x": 1}},
     "stream_options.x"),
    ("/v1/completions", {**COMPLETION, "min_tokens": 20, "max_tokens": 5}, "min_tokens"),
    ("/v1/chat/completions", {**CHAT, "messages": []}, "messages"),
    ("/v1/chat/completions", {**CHAT, "messages": [{"role": "wizard", "content": "x"}]},
     "messages.0.role"),
    ("/v1/chat/completions", {**CHAT, "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "x"}}]}]}, "messages.0.content.0.type"),
    ("/v1/chat/completions", {**CHAT, "prompt": "hi"}, "prompt"),
    ("/v1/chat/completions", {**CHAT, "top_logprobs": 2}, "top_logprobs"),
    ("/v1/chat/completions", {**CHAT, "top_logprobs": 21, "logprobs": True}, "top_logprobs"),
    ("/v1/chat/completions", {**CHAT, "max_completion_tokens": -5}, "max_completion_tokens"),
    # no silent drops: unknown fields, fields for features this server lacks, bad values
    ("/v1/completions", {**COMPLETION, "repetition_penalty": 1.2}, "repetition_penalty"),
    ("/v1/chat/completions", {**CHAT, "guided_json": {}}, "guided_json"),
    ("/v1/completions", {**COMPLETION, "suffix": "end"}, "suffix"),
    ("/v1/completions", {**COMPLETION, "best_of": 2, "n": 3}, "best_of"),
    ("/v1/completions", {**COMPLETION, "best_of": 3, "stream": True}, "best_of"),
    ("/v1/completions", {**COMPLETION, "logit_bias": {"hello": 1}}, "logit_bias"),
    ("/v1/completions", {**COMPLETION, "logit_bias": {"5": 101}}, "logit_bias"),
    ("/v1/completions", {**COMPLETION, "logit_bias": {"\u00b2": 1}}, "logit_bias"),
    ("/v1/chat/completions", {**CHAT, "logit_bias": {"-1": 3}}, "logit_bias"),
    ("/v1/chat/completions", {**CHAT, "metadata": {"a": "b"}}, "metadata"),  # not stored
    ("/v1/chat/completions", {**CHAT, "store": True, "metadata": {"a": 1}}, "metadata.a"),
    ("/v1/chat/completions", {**CHAT, "store": True, "metadata": {"a": "b" * 513}},
     "metadata"),
    ("/v1/chat/completions", {**CHAT, "store": True,
                              "metadata": {str(i): "v" for i in range(17)}}, "metadata"),
    ("/v1/chat/completions", {**CHAT, "service_tier": "priority"}, "service_tier"),
    ("/v1/chat/completions", {**CHAT, "modalities": ["text", "audio"]}, "modalities"),
    ("/v1/chat/completions", {**CHAT, "audio": {"voice": "alloy", "format": "mp3"}}, "audio"),
    ("/v1/chat/completions", {**CHAT, "prediction": {"type": "content", "content": "x"}},
     "prediction"),
    ("/v1/chat/completions", {**CHAT, "reasoning_effort": "low"}, "reasoning_effort"),
    ("/v1/chat/completions", {**CHAT, "verbosity": "low"}, "verbosity"),
    ("/v1/chat/completions", {**CHAT, "web_search_options": {}}, "web_search_options"),
    ("/v1/chat/completions", {**CHAT, "prompt_cache_key": "k"}, "prompt_cache_key"),
    ("/v1/chat/completions", {**CHAT, "prompt_cache_retention": "24h"}, "prompt_cache_retention"),
    ("/v1/chat/completions", {**CHAT, "prompt_cache_options": {"ttl": "1h"}},
     "prompt_cache_options"),
    ("/v1/chat/completions", {**CHAT, "moderation": {"model": "m"}}, "moderation"),
    ("/v1/chat/completions", {**CHAT, "functions": [{"name": "f"}]}, "functions"),
    ("/v1/chat/completions", {**CHAT, "function_call": "auto"}, "function_call"),
    # structured outputs and tools
    ("/v1/chat/completions", {**CHAT, "response_format": {"type": "xml"}}, "response_format"),
    ("/v1/chat/completions", {**CHAT, "response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "object", "properties": {"a": {"type": "bogus"}}}}}},
     "response_format"),
    ("/v1/completions", {**COMPLETION, "response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "string", "pattern": "(["}}}}, "response_format"),
    ("/v1/chat/completions", {**CHAT, "response_format": {"type": "json_object"},
                              "ignore_eos": True}, "ignore_eos"),
    ("/v1/chat/completions", {**CHAT, "tool_choice": "required"}, "tool_choice"),
    ("/v1/chat/completions", {**CHAT, "parallel_tool_calls": False}, "parallel_tool_calls"),
    ("/v1/chat/completions", {**CHAT, "tools": [TOOL], "tool_choice": {
        "type": "function", "function": {"name": "other"}}}, "tool_choice"),
    ("/v1/chat/completions", {**CHAT, "tools": [TOOL], "tool_choice": "required",
                              "response_format": {"type": "json_object"}}, "response_format"),
    ("/v1/chat/completions", {**CHAT, "tools": [TOOL, TOOL], "tool_choice": "none"},
     "tools.1.function.name"),
    ("/v1/chat/completions", {**CHAT, "tools": [{"type": "function", "function": {
        "name": "f", "parameters": {"type": "object", "properties": {"a": {"type": "nope"}}}}}],
        "tool_choice": "required"}, "tools"),
    ("/v1/chat/completions", {**CHAT, "messages": [{"role": "tool", "tool_call_id": "c"}]},
     "messages.0.content"),
    ("/v1/chat/completions", {**CHAT, "messages": [{"role": "tool", "content": "18C"}]},
     "messages.0.tool_call_id"),
]


def assert_openai_error(response, status: int) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["message"] and "Traceback" not in error["message"]
    return error


@pytest.mark.parametrize(("path", "body", "param"), BAD,
                         ids=[f"{p.rsplit('/', 1)[1]}-{param}" for p, _, param in BAD])
def test_invalid_fields_are_400(client, path: str, body: dict, param: str) -> None:
    error = assert_openai_error(client.post(path, json=body, headers=KEY), 400)
    assert error["param"] == param
    assert error["type"] == "invalid_request_error"


def test_not_json_invalid_utf8_and_oversized(client) -> None:
    error = assert_openai_error(client.post("/v1/completions", content=b"{not json",
                                            headers={**KEY, "content-type": "application/json"}),
                                400)
    assert "JSON" in error["message"]
    assert_openai_error(client.post("/v1/completions", content=b'{"prompt": "\xff\xfe"}',
                                    headers={**KEY, "content-type": "application/json"}), 400)
    big = {**COMPLETION, "prompt": "x" * 100_000}
    assert_openai_error(client.post("/v1/completions", json=big, headers=KEY), 413)
    assert_openai_error(client.post("/v1/completions", json=[1, 2], headers=KEY), 400)


def test_missing_and_wrong_keys_are_401(client) -> None:
    for headers in ({}, {"Authorization": "Bearer nope"}, {"Authorization": "Basic x"}):
        for method, path in (("get", "/v1/models"), ("post", "/v1/completions"),
                             ("post", "/v1/chat/completions"), ("get", "/v1/models/x"),
                             ("delete", "/v1/models/x")):
            response = getattr(client, method)(path, headers=headers,
                                               **({"json": COMPLETION} if method == "post" else {}))
            assert_openai_error(response, 401)


def test_unknown_model_is_404_and_unknown_route_too(client) -> None:
    error = assert_openai_error(client.post("/v1/completions", json={**COMPLETION,
                                                                      "model": "acme/x"},
                                            headers=KEY), 404)
    assert error["code"] == "model_not_found"
    assert_openai_error(client.get("/v1/nothing-here", headers=KEY), 404)
    assert_openai_error(client.put("/v1/models", headers=KEY), 405)


def test_manager_down_is_503_not_a_hang(unmanaged) -> None:
    client = unmanaged
    error = assert_openai_error(client.post("/v1/completions", json=COMPLETION, headers=KEY), 503)
    assert error["type"] == "service_unavailable"
    ready = client.get("/ready")
    assert ready.status_code == 503 and ready.json()["checks"]["manager"] is False


def test_base_model_cannot_be_deleted(client) -> None:
    assert_openai_error(client.delete("/v1/models/tiny-llama", headers=KEY), 403)


HUGE = 2**64  # one past what msgspec and SQLite hold
OUT_OF_RANGE = [
    ("/v1/completions", {**COMPLETION, "prompt": [-1]}, "prompt"),
    ("/v1/completions", {**COMPLETION, "prompt": [HUGE]}, "prompt"),
    ("/v1/completions", {**COMPLETION, "max_tokens": HUGE}, "max_tokens"),
    ("/v1/completions", {**COMPLETION, "top_k": HUGE}, "top_k"),
    ("/v1/chat/completions", {**CHAT, "max_completion_tokens": HUGE}, "max_completion_tokens"),
]


@pytest.mark.parametrize(("path", "body", "param"), OUT_OF_RANGE,
                         ids=[f"{p.rsplit('/', 1)[1]}-{param}-{i}"
                              for i, (p, _, param) in enumerate(OUT_OF_RANGE)])
def test_out_of_range_numbers_are_400(client, path: str, body: dict, param: str) -> None:
    error = assert_openai_error(client.post(path, json=body, headers=KEY), 400)
    assert error["param"] == param


@pytest.mark.parametrize("prompt", [[99999999], [[5, 99999999]]])
def test_token_ids_past_the_vocabulary_are_400(client, prompt: list) -> None:
    vocab = json.loads((resolve_model("tiny-llama") / "config.json").read_text())["vocab_size"]
    error = assert_openai_error(client.post("/v1/completions", json={
        **COMPLETION, "prompt": prompt}, headers=KEY), 400)
    assert error["param"] == "prompt" and f"vocabulary has {vocab} tokens" in error["message"]


@pytest.mark.parametrize(("path", "raw", "param"), [
    ("/v1/completions", '{"model": "tiny-llama", "prompt": "a\\ud800b"}', "prompt"),
    ("/v1/completions", '{"model": "tiny-llama", "prompt": ["ok", "\\udc00"]}', "prompt.1"),
    ("/v1/completions", '{"model": "tiny-llama", "prompt": "x", "stop": "\\ud800"}', "stop"),
    ("/v1/chat/completions", '{"model": "tiny-llama", "messages": [{"role": "user", '
                             '"content": "\\ud83d"}]}', "messages.0.content"),
])
def test_lone_surrogates_are_400(client, path: str, raw: str, param: str) -> None:
    error = assert_openai_error(client.post(path, content=raw.encode(),
                                            headers={**KEY, "content-type": "application/json"}),
                                400)
    assert error["param"] == param and "surrogate" in error["message"]


def test_a_surrogate_pair_is_fine(client) -> None:
    raw = '{"model": "tiny-llama", "prompt": "\\ud83d\\ude00"}'  # one emoji: valid
    response = client.post("/v1/completions", content=raw.encode(),
                           headers={**KEY, "content-type": "application/json"})
    assert response.status_code == 503  # past validation; no manager in these tests


@pytest.mark.parametrize(("seed", "status"), [(2**63 - 1, 503), (-(2**63), 503), (0, 503),
                                              (2**63, 400), (-(2**63) - 1, 400), (2**65, 400)])
def test_a_seed_is_a_64_bit_integer(client, seed: int, status: int) -> None:
    """As documented: in range it passes validation (503: no manager in these tests); out of
    range it is refused, never wrapped."""
    response = client.post("/v1/completions", json={**COMPLETION, "seed": seed}, headers=KEY)
    error = assert_openai_error(response, status)
    if status == 400:
        assert error["param"] == "seed"


@pytest.mark.parametrize("fields", [{"top_p": 0}, {"n": 128}, {"n": 20, "best_of": 20}])
def test_openai_s_edge_values_pass(client, fields: dict) -> None:
    """What OpenAI's spec allows passes validation (503: no manager in these tests); a worker
    refuses an n past its batch (`tests/workers/inference/test_engine.py`)."""
    for path, body in (("/v1/completions", COMPLETION), ("/v1/chat/completions", CHAT)):
        if "best_of" not in fields or "prompt" in body:
            response = client.post(path, json={**body, **fields}, headers=KEY)
            assert_openai_error(response, 503)


@pytest.mark.parametrize(("prompt", "named"), [
    ([HUGE], f"prompt[0] is {HUGE}"), ([3, -1], "prompt[1] is -1"),
    ([[5, 2**40]], f"prompt[0][1] is {2**40}"), ([[5], []], "prompt[1] is an empty list"),
    ([], "the prompt is an empty list")])
def test_a_bad_token_id_is_named(client, prompt: list, named: str) -> None:
    error = assert_openai_error(client.post("/v1/completions", json={**COMPLETION,
                                                                     "prompt": prompt},
                                            headers=KEY), 400)
    assert error["param"] == "prompt" and named in error["message"], error
    assert error["message"].startswith(f"Invalid value for 'prompt': {named}")  # as written


def test_malformed_json_names_no_field(client) -> None:
    error = assert_openai_error(client.post("/v1/completions", content=b'{"model": "x",',
                                            headers={**KEY, "content-type": "application/json"}),
                                400)
    assert error["param"] is None and "byte" in error["message"]


def test_only_fine_tune_uploads_are_taken(client) -> None:
    response = client.post("/v1/files", headers=KEY, data={"purpose": "fine-tune-results"},
                           files={"file": ("a.jsonl", b'{"prompt": "a", "completion": "b"}')})
    assert assert_openai_error(response, 400)["param"] == "purpose"


def test_an_unknown_field_is_named_as_openai_names_it(client) -> None:
    error = assert_openai_error(client.post("/v1/completions", headers=KEY, json={
        **COMPLETION, "repetition_penalty": 1.2}), 400)
    assert error["message"] == "Unrecognized request argument supplied: repetition_penalty"
    error = assert_openai_error(client.post("/v1/chat/completions", headers=KEY,
                                            json={**CHAT, "prompt": "hi"}), 400)
    assert "use 'messages'" in error["message"]


def test_a_schema_nested_without_end_is_a_400(client) -> None:
    schema: dict = {"type": "string"}
    for _ in range(200):
        schema = {"type": "array", "items": schema}
    error = assert_openai_error(client.post("/v1/chat/completions", headers=KEY, json={
        **CHAT, "response_format": {"type": "json_schema", "json_schema": {
            "name": "deep", "schema": schema}}}), 400)
    assert "nested" in error["message"]


def test_an_invalid_schema_says_what_is_wrong(client) -> None:
    error = assert_openai_error(client.post("/v1/chat/completions", headers=KEY, json={
        **CHAT, "response_format": {"type": "json_schema", "json_schema": {
            "name": "x", "schema": {"type": "object", "properties": {"a": {"type": "bogus"}}}}}}),
        400)
    assert "bogus" in error["message"]


def test_a_path_with_a_control_character_names_nothing(managed, tmp_path) -> None:
    """The router would read `acme/memo\\n` as `acme/memo`: a DELETE deleted the model."""
    from tests.e2e.adapters import save_adapter

    client, manager = managed
    manager.registry.register("acme", "memo", save_adapter(tmp_path / "memo", "lora", 1))
    for method, path in (("DELETE", "/v1/models/acme/memo%0A"), ("GET", "/v1/models/acme/memo%0A"),
                         ("GET", "/v1/models/acme/memo%0D%0A"), ("GET", "/v1/files/x%00"),
                         ("GET", "/v1/adapters/acme/memo%0A/versions")):
        error = assert_openai_error(client.request(method, path, headers=KEY), 404)
        assert error["message"].startswith("Unknown request URL"), (method, path)
    assert client.get("/v1/models/acme/memo", headers=KEY).status_code == 200

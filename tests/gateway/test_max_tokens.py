"""How long an answer may be: a chat request without max_tokens gets the server's default (a
short one for a built-in random model, else until the context is full), and no request may ask
for more than the server's cap (a 400 naming the field)."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from gateway.app import create_app
from gateway.sampling import chat_params
from gateway.settings import BUILTIN_DEFAULT_MAX_TOKENS, GatewaySettings
from openapi.chat import ChatCompletionRequest
from tests.gateway.conftest import KEY

ASK = {"model": "tiny-llama", "messages": [{"role": "user", "content": "hi"}]}


def _chat(**fields) -> ChatCompletionRequest:
    return ChatCompletionRequest(**ASK, **fields)


def test_a_built_in_model_answers_briefly_unless_told_otherwise(tmp_path) -> None:
    assert GatewaySettings(model="tiny-llama").chat_default_max_tokens() == \
        BUILTIN_DEFAULT_MAX_TOKENS
    assert GatewaySettings(model=str(tmp_path)).chat_default_max_tokens() is None
    assert GatewaySettings(model="tiny-llama", default_max_tokens=40) \
        .chat_default_max_tokens() == 40


@pytest.mark.parametrize(("fields", "default", "cap", "expected"), [
    ({}, None, 0, None),  # until the context is full
    ({}, 128, 0, 128),
    ({}, None, 300, 300),
    ({}, 128, 64, 64),  # the cap bounds the default too
    ({"max_tokens": 20}, 128, 0, 20),
    ({"max_completion_tokens": 20, "max_tokens": 50}, 128, 0, 20),
    ({"min_tokens": 200}, 128, 0, 200),  # never below what the request insists on
])
def test_the_default_and_the_cap(fields, default, cap, expected) -> None:
    assert chat_params(_chat(**fields), default, cap).max_tokens == expected


def test_asking_past_the_cap_is_a_400_naming_the_field(tmp_path) -> None:
    settings = GatewaySettings(data_dir=tmp_path, api_keys="acme=sk-acme", max_tokens_cap=100,
                               manager="ipc:///tmp/symbiosis-test-no-manager.sock")
    with TestClient(create_app(settings)) as client:
        for path, body, param in (
                ("/v1/chat/completions", {**ASK, "max_tokens": 101}, "max_tokens"),
                ("/v1/chat/completions", {**ASK, "max_completion_tokens": 500},
                 "max_completion_tokens"),
                ("/v1/chat/completions", {**ASK, "min_tokens": 200}, "min_tokens"),
                ("/v1/completions", {"model": "tiny-llama", "prompt": "x", "max_tokens": 101},
                 "max_tokens")):
            response = client.post(path, json=body, headers=KEY)
            assert response.status_code == 400, response.text
            error = response.json()["error"]
            assert error["param"] == param and "at most 100" in error["message"]
        within = client.post("/v1/chat/completions", json={**ASK, "max_tokens": 100},
                             headers=KEY)
        assert within.status_code == 503  # past validation; no manager in these tests

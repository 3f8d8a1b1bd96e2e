"""A tenant's KV-cache budget across its in-flight requests; a long prompt's tokens counted
off the event loop, which answers other requests meanwhile."""

from __future__ import annotations

import asyncio

import pytest
from fastapi.testclient import TestClient

from catalogue.resolve import resolve_model
from gateway.app import create_app
from gateway.errors import APIError
from gateway.kv_budget import counted, kv_tokens, reserve
from gateway.settings import GatewaySettings
from gateway.tenants import Tenant, TenantDirectory
from gateway.tokens import TextTokens
from tests.gateway.conftest import assert_answered_all_along, health_meanwhile
from wire import manager as W

TOKENS = TextTokens("tiny-llama")


@pytest.fixture(autouse=True, scope="module")
def exported() -> None:
    """The tokenizer's files (a first count in a process without them would count 0 for good)."""
    resolve_model("tiny-llama")


def test_a_request_holds_prompt_plus_output_tokens_per_sequence() -> None:
    params = W.SamplingParams(max_tokens=10, n=3)
    assert kv_tokens(TOKENS, [{"prompt_ids": [1, 2, 3, 4]}], params, 2048) == (4 + 10) * 3
    hello = TOKENS.count("Hello there")
    assert hello > 0
    assert kv_tokens(TOKENS, [{"prompt": "Hello there"}, {"prompt_ids": [5]}],
                     W.SamplingParams(max_tokens=2), 2048) == (hello + 2) + (1 + 2)
    chat = [W.ChatMessage("user", "Hello there")]
    until_context = W.SamplingParams(max_tokens=None)
    assert kv_tokens(TOKENS, [{"messages": chat}], until_context, 100) == 100
    long_chat = [W.ChatMessage("user", "word " * 300)] * 3  # longer than a context of 100
    assert kv_tokens(TOKENS, [{"messages": long_chat}], W.SamplingParams(max_tokens=10),
                     100) > 900
    cut = W.SamplingParams(max_tokens=10, truncate=True)  # its earliest messages will go
    assert kv_tokens(TOKENS, [{"messages": long_chat}], cut, 100) == 100


def held(directory: TenantDirectory, tenant: Tenant, prompts: list[dict],
         params: W.SamplingParams) -> int:
    lengths = asyncio.run(counted(TOKENS, tenant, prompts, params))
    return reserve(directory, TOKENS, tenant, lengths, params)


def test_requests_fit_beside_each_other_or_wait() -> None:
    tenant = Tenant("acme", max_kv_tokens=50)
    directory = TenantDirectory([tenant])
    params = W.SamplingParams(max_tokens=16)
    first = held(directory, tenant, [{"prompt_ids": [1] * 14}], params)
    assert first == 30
    with pytest.raises(APIError) as info:
        held(directory, tenant, [{"prompt_ids": [1] * 14}], params)
    assert info.value.status == 429 and "retry" in info.value.message
    assert info.value.headers == {"Retry-After": "1"}
    directory.free_kv(tenant, first)
    assert held(directory, tenant, [{"prompt_ids": [1] * 14}], params) == 30
    unlimited = Tenant("beta")
    assert held(directory, unlimited, [{"prompt_ids": [1] * 900}], params) == 0
    directory.free_kv(tenant, 30)
    text = [{"prompt": "Hello there"}]  # counted by a worker thread
    assert held(directory, tenant, text, params) == TOKENS.count("Hello there") + 16


def test_flex_requests_hold_at_most_three_quarters_of_the_budget() -> None:
    tenant = Tenant("acme", max_kv_tokens=100)
    directory = TenantDirectory([tenant])
    flex, interactive = W.SamplingParams(max_tokens=10, flex=True), W.SamplingParams(max_tokens=10)
    assert held(directory, tenant, [{"prompt_ids": [1] * 80}], flex) == 90  # alone: all it needs
    directory.free_kv(tenant, 90, flex=True)
    assert held(directory, tenant, [{"prompt_ids": [1] * 40}], flex) == 50
    with pytest.raises(APIError) as info:  # 50 + 30 of flex's: past its 75
        held(directory, tenant, [{"prompt_ids": [1] * 20}], flex)
    assert info.value.status == 429 and "flex requests at most three quarters" in \
        info.value.message
    assert held(directory, tenant, [{"prompt_ids": [1] * 20}], interactive) == 30
    assert held(directory, tenant, [{"prompt_ids": [1] * 10}], flex) == 20  # 70 of flex's
    with pytest.raises(APIError):  # 100 held: the budget's end, whichever tier
        held(directory, tenant, [{"prompt_ids": [1]}], interactive)
    directory.free_kv(tenant, 30)  # the interactive one ends: its tokens come back
    assert held(directory, tenant, [{"prompt_ids": [1] * 20}], interactive) == 30


def test_a_request_larger_than_the_budget_is_a_400(tmp_path) -> None:
    settings = GatewaySettings(data_dir=tmp_path, api_keys="acme=sk-acme", max_kv_tokens=100,
                               manager="ipc:///tmp/symbiosis-test-no-manager.sock")
    with TestClient(create_app(settings)) as client:
        response = client.post("/v1/completions", headers={"Authorization": "Bearer sk-acme"},
                               json={"model": "tiny-llama", "prompt": "hi", "max_tokens": 50,
                                     "n": 3})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["code"] == "kv_budget_exceeded"


def test_a_long_prompt_is_counted_while_other_requests_are_answered(tmp_path) -> None:
    settings = GatewaySettings(data_dir=tmp_path, api_keys="acme=sk-acme", max_kv_tokens=1000,
                               manager="ipc:///tmp/symbiosis-test-no-manager.sock")
    prompt = ("The quick brown fox jumps over the lazy dog. " * 45_000)[:1_900_000]
    with TestClient(create_app(settings)) as client:
        refused, seconds, waits = health_meanwhile(client, lambda: client.post(
            "/v1/completions", headers={"Authorization": "Bearer sk-acme"},
            json={"model": "tiny-llama", "prompt": prompt, "max_tokens": 1}))
    assert refused.status_code == 400 and refused.json()["error"]["code"] == \
        "kv_budget_exceeded", refused.text
    assert f"about {TOKENS.count(prompt) + 1} KV-cache tokens" in refused.json()["error"]["message"]
    assert seconds > 0.2 and len(waits) >= 3  # the test saw the counting happen
    assert_answered_all_along(waits, seconds)

"""A tenant's requests and tokens per minute: buckets of a minute's worth refilling continuously,
reported in OpenAI's `x-ratelimit-*` headers; past them a 429 whose `retry-after-ms` the
official `openai` SDK waits by before it retries; the other tenants untouched."""

from __future__ import annotations

import time

import openai
import pytest
from fastapi.testclient import TestClient

from gateway.app import create_app
from gateway.errors import APIError
from gateway.in_process import retry_s
from gateway.rate_limits import RateLimits, TokenMeter, duration
from gateway.sessions import new_link
from gateway.settings import GatewaySettings
from gateway.tenants import Tenant, TenantDirectory
from tests.gateway.conftest import serving
from tests.gateway.test_upload_parts import sdk
from tests.gateway.test_validation import assert_openai_error
from wire import manager as W


class Clock:
    """Still until `real_from` is set, then as time passes from then."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.real_from: float | None = None

    def __call__(self) -> float:
        return self.now + (time.monotonic() - self.real_from if self.real_from else 0.0)


@pytest.mark.parametrize(("seconds", "written"), [
    (0, "0s"), (0.0004, "1ms"), (0.12, "120ms"), (1, "1s"), (1.5, "1.5s"), (59.9994, "59.999s"),
    (59.9996, "1m0s"), (60, "1m0s"), (90.25, "1m30.25s"), (360, "6m0s")])
def test_a_wait_is_written_as_openai_writes_it(seconds: float, written: str) -> None:
    assert duration(seconds) == written


def test_requests_take_a_minutes_worth_then_wait_for_the_refill() -> None:
    clock, acme, beta = Clock(), Tenant("acme", requests_per_minute=3), Tenant("beta")
    limits = RateLimits(clock)
    for _ in range(3):
        limits.take_request(acme)
        limits.take_request(beta)  # no limit of its own: never refused, no headers
    assert limits.headers(beta) == {}
    assert limits.report(beta) == {"requests": None, "tokens": None}
    assert limits.report(acme) == {"requests": {"limit": 3, "remaining": 0, "reset": "1m0s"},
                                   "tokens": None}
    assert limits.headers(acme) == {"x-ratelimit-limit-requests": "3",
                                    "x-ratelimit-remaining-requests": "0",
                                    "x-ratelimit-reset-requests": "1m0s"}
    with pytest.raises(APIError) as refused:
        limits.take_request(acme)
    assert refused.value.status == 429 and refused.value.code == "rate_limit_exceeded"
    assert refused.value.headers == {"retry-after": "20", "retry-after-ms": "20000"}  # 60 s / 3
    assert "limit 3, remaining 0, requested 1. Please try again in 20s." in \
        refused.value.message
    clock.now += 5
    assert limits.headers(acme)["x-ratelimit-reset-requests"] == "55s"
    with pytest.raises(APIError) as still:
        limits.take_request(acme)
    assert still.value.headers["retry-after-ms"] == "15000"
    clock.now += 15
    limits.take_request(acme)  # one request's worth refilled
    clock.now += 3600
    assert limits.headers(acme)["x-ratelimit-remaining-requests"] == "3"  # full, no more


def test_a_limit_changed_keeps_what_the_bucket_held_up_to_the_new_limit() -> None:
    limits = RateLimits(Clock())
    for _ in range(8):
        limits.take_request(Tenant("acme", requests_per_minute=10))
    assert limits.headers(Tenant("acme", requests_per_minute=60))[
        "x-ratelimit-remaining-requests"] == "2"
    assert limits.headers(Tenant("acme", requests_per_minute=1))[
        "x-ratelimit-remaining-requests"] == "1"


def test_tokens_are_the_prompts_then_each_generated_one_set_right_by_the_worker() -> None:
    clock, tenant = Clock(), Tenant("acme", tokens_per_minute=120)  # 2 tokens a second
    limits = RateLimits(clock)
    limits.take_prompt(tenant, 30)
    meter = TokenMeter(limits, tenant, [20, 10])  # two prompts, estimated 20 and 10
    for _ in range(2):
        meter.tick(0, W.Delta("a", 0, "x"))
    meter.tick(0, W.Delta("a", 0, "xyz", tokens=3))  # a collected answer's tokens, merged
    meter.tick(1, W.Delta("b", 0, "y"))
    assert limits.headers(tenant)["x-ratelimit-remaining-tokens"] == str(120 - 30 - 6)
    meter.tick(0, W.Done("a", prompt_tokens=22, completion_tokens=5))  # 2 more than estimated
    meter.tick(1, W.Done("b", prompt_tokens=10, completion_tokens=0))  # its Delta no token
    assert limits.headers(tenant)["x-ratelimit-remaining-tokens"] == str(120 - 27 - 10)
    limits.spend(tenant, 100)  # a long answer: the bucket owes 17
    assert limits.headers(tenant)["x-ratelimit-remaining-tokens"] == "0"
    with pytest.raises(APIError) as refused:
        limits.take_prompt(tenant, 3)
    assert refused.value.status == 429
    assert refused.value.headers["retry-after-ms"] == str((17 + 3) * 500)
    clock.now += 10
    limits.take_prompt(tenant, 3)
    with pytest.raises(APIError) as too_large:
        limits.take_prompt(tenant, 121)
    assert (too_large.value.status, too_large.value.code) == (400, "tokens_per_minute_exceeded")
    meter = TokenMeter(limits, tenant, [3])  # the prompt just taken
    meter.tick(0, W.Delta("c", 0, "z"))
    assert limits.headers(tenant)["x-ratelimit-remaining-tokens"] == "0"  # owing 1
    meter.give_back()  # it never ran after all: the 4 it took are back, once
    assert limits.headers(tenant)["x-ratelimit-remaining-tokens"] == "3"
    meter.give_back()
    limits.take_prompt(tenant, 3)
    with pytest.raises(APIError):
        limits.take_prompt(tenant, 1)
    clock.now += 60
    limits.spend(tenant, -50)  # given back into a full bucket: still a minute's worth
    assert limits.headers(tenant)["x-ratelimit-remaining-tokens"] == "120"
    free = Tenant("beta")
    limits.take_prompt(free, 10**6)
    TokenMeter(limits, free, [1]).tick(0, W.Delta("c", 0, "z"))
    assert limits.headers(free) == {}


def test_the_limits_come_from_the_tenants_file_or_the_server(tmp_path) -> None:
    path = tmp_path / "tenants.json"
    path.write_text('{"tenants": [{"id": "acme", "key_sha256": [], "requests_per_minute": 5},'
                    ' {"id": "beta", "key_sha256": [], "tokens_per_minute": 0}]}')
    directory = TenantDirectory.load(path, requests_per_minute=60, tokens_per_minute=1000)
    acme, beta = directory.get("acme"), directory.get("beta")
    assert (acme.requests_per_minute, acme.tokens_per_minute) == (5, 1000)
    assert (beta.requests_per_minute, beta.tokens_per_minute) == (60, 0)
    for bad in ('-1', '1.5', 'true', '"10"'):
        path.write_text(f'{{"tenants": [{{"id": "acme", "requests_per_minute": {bad}}}]}}')
        with pytest.raises(ValueError, match="requests_per_minute is a whole number"):
            TenantDirectory.load(path)


@pytest.fixture()
def limited(tmp_path):
    settings = GatewaySettings(data_dir=tmp_path, api_keys="acme=sk-acme,beta=sk-beta",
                               admin_keys="sk-operator", manager=f"ipc://{tmp_path}/manager.sock",
                               requests_per_minute=120)
    with serving(settings) as (client, _):
        clock = Clock()
        client.app.state.rate_limits = RateLimits(clock)
        yield client, clock


def refused_for_requests(client, tenant: str) -> float:
    metrics = client.get("/metrics", headers={"Authorization": "Bearer sk-operator"}).text
    line = f'symbiosis_rejected_total{{reason="requests_per_minute",tenant="{tenant}"}} '
    return next((float(row.split()[-1]) for row in metrics.splitlines()
                 if row.startswith(line)), 0.0)


def test_a_tenant_past_its_requests_gets_429s_the_sdk_waits_out(limited) -> None:
    client, clock = limited
    acme, beta = sdk(client, "sk-acme"), sdk(client, "sk-beta")
    listed = acme.models.with_raw_response.list()
    assert listed.headers["x-ratelimit-limit-requests"] == "120"
    assert listed.headers["x-ratelimit-remaining-requests"] == "119"
    assert listed.headers["x-ratelimit-reset-requests"] == "500ms"
    assert "x-ratelimit-limit-tokens" not in listed.headers  # no tokens per minute set
    for _ in range(119):
        acme.files.list()  # any route of a tenant's counts
    with pytest.raises(openai.RateLimitError) as refused:
        acme.models.list()
    error = assert_openai_error(refused.value.response, 429)
    assert error["code"] == "rate_limit_exceeded" and "requests per minute (RPM) of tenant acme" \
        in error["message"]
    headers = refused.value.response.headers
    assert (headers["retry-after"], headers["retry-after-ms"]) == ("1", "500")  # 60 s / 120
    assert headers["x-ratelimit-remaining-requests"] == "0"
    documented = client.app.openapi()["paths"]["/v1/models"]["get"]["responses"]["429"]["headers"]
    assert {name for name in documented if not name.endswith("-tokens")} <= set(headers)
    assert beta.models.list().data  # the other tenant untouched
    assert refused_for_requests(client, "acme") == 1
    patient = openai.OpenAI(api_key="sk-acme", base_url=f"{client.base_url}/v1",
                            http_client=client, max_retries=2)
    clock.real_from = time.monotonic()  # time passes from here
    started = time.monotonic()
    assert patient.models.list().data  # refused once more, then waited out
    assert time.monotonic() - started >= 0.5
    assert refused_for_requests(client, "acme") == 2


def test_a_request_that_never_ran_gives_its_prompts_tokens_back(tmp_path) -> None:
    settings = GatewaySettings(data_dir=tmp_path, api_keys="acme=sk-acme", tokens_per_minute=100,
                               manager="ipc:///tmp/symbiosis-test-no-manager.sock")
    with TestClient(create_app(settings)) as client:
        client.app.state.rate_limits = RateLimits(Clock())
        response = client.post("/v1/completions", headers={"Authorization": "Bearer sk-acme"},
                               json={"model": "tiny-llama", "prompt": [5, 6, 7], "max_tokens": 4})
    assert_openai_error(response, 503)  # no manager to run it
    assert response.headers["x-ratelimit-remaining-tokens"] == "100"
    assert response.headers["x-ratelimit-limit-tokens"] == "100"


def test_the_dashboards_reads_in_a_signed_in_browser_are_not_counted(tmp_path) -> None:
    token, setting = new_link("acme")
    settings = GatewaySettings(data_dir=tmp_path, api_keys="acme=sk-acme", dashboard_link=setting,
                               requests_per_minute=2,
                               manager="ipc:///tmp/symbiosis-test-no-manager.sock")
    with TestClient(create_app(settings)) as client:
        client.app.state.rate_limits = RateLimits(Clock())
        assert client.post("/dashboard/api/signin", json={"link": token}).status_code == 200
        for _ in range(5):  # a dashboard refreshing
            read = client.get("/v1/models")
            assert read.status_code == 200 and "x-ratelimit-limit-requests" not in read.headers
        key = {"Authorization": "Bearer sk-acme"}
        assert [client.get("/v1/models", headers=key).status_code for _ in range(3)] == \
            [200, 200, 429]


@pytest.mark.parametrize(("headers", "wait_s"), [
    ({"retry-after-ms": "15000"}, 15.0), ({"retry-after-ms": "100"}, 0.5),
    ({"retry-after": "1"}, 0.5), ({"retry-after-ms": "soon"}, 0.5)])
def test_the_gateways_own_requests_wait_as_a_rate_limits_429_says(headers, wait_s) -> None:
    assert retry_s(headers, 0.5) == wait_s  # a batch's line, a background response

"""Bodies are read only after authentication and only up to the limit; /metrics needs an
operator key. The app is driven as raw ASGI, so the test sees every chunk the server pulls."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from gateway.app import create_app
from gateway.guard import FORM_FRAMING
from gateway.rate_limits import RateLimits
from gateway.settings import GatewaySettings
from tests.gateway.conftest import KEY

CHUNK = 16 * 1024


def make_app(data_dir):
    return create_app(GatewaySettings(data_dir=data_dir, api_keys="acme=sk-acme",
                                      admin_keys="sk-operator",
                                      manager="ipc:///tmp/symbiosis-test-no-manager.sock",
                                      max_body_bytes=64 * 1024, max_upload_bytes=256 * 1024))


@pytest.fixture()
def app(tmp_path) -> Iterator:
    application = make_app(tmp_path)
    with TestClient(application):  # runs the lifespan (tenants, stores)
        yield application


def drive(app, path: str, headers: dict[str, str], chunks: int,
          answered: dict[str, str] | None = None) -> tuple[int, dict, int]:
    """POST `chunks` chunks of CHUNK bytes with no Content-Length (a multipart body is one
    endless file field); returns (status, JSON body, chunks the server pulled); the answer's
    headers go into `answered`."""
    first = PART_HEAD if headers.get("content-type", "").startswith("multipart/") else b""
    pulled = 0
    sent: list[dict] = []

    async def receive() -> dict:
        nonlocal pulled
        if pulled >= chunks:
            await asyncio.sleep(3600)  # a client that stalls after its last chunk
        pulled += 1
        head = first if pulled == 1 else b""
        return {"type": "http.request", "body": head + b"x" * (CHUNK - len(head)),
                "more_body": pulled < chunks}

    async def send(message: dict) -> None:
        sent.append(message)

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
             "method": "POST", "scheme": "http", "path": path, "raw_path": path.encode(),
             "query_string": b"", "root_path": "", "client": ("127.0.0.1", 1),
             "server": ("127.0.0.1", 80), "app": app,
             "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()]}
    asyncio.run(asyncio.wait_for(app(scope, receive, send), 10))
    start = next(m for m in sent if m["type"] == "http.response.start")
    if answered is not None:
        answered.update((k.decode(), v.decode()) for k, v in start["headers"])
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return start["status"], json.loads(body), pulled


MULTIPART = {"content-type": "multipart/form-data; boundary=xyz"}
PART_HEAD = (b'--xyz\r\nContent-Disposition: form-data; name="file"; filename="a.jsonl"\r\n'
             b"Content-Type: application/octet-stream\r\n\r\n")


@pytest.mark.parametrize(("path", "headers"), [
    ("/v1/files", MULTIPART),
    ("/v1/completions", {"content-type": "application/json"}),
    ("/v1/fine_tuning/jobs", {"content-type": "application/json"}),
])
def test_no_body_is_read_before_authentication(app, path: str, headers: dict) -> None:
    status, body, pulled = drive(app, path, headers, chunks=64)
    assert (status, body["error"]["code"], pulled) == (401, "missing_api_key", 0)
    status, body, pulled = drive(app, path, {**headers, "authorization": "Bearer sk-nope"}, 64)
    assert (status, body["error"]["code"], pulled) == (401, "invalid_api_key", 0)


@pytest.mark.parametrize(("path", "headers", "limit"), [
    ("/v1/files", MULTIPART, 256 * 1024 + FORM_FRAMING),
    ("/v1/completions", {"content-type": "application/json"}, 64 * 1024),
])
def test_bodies_are_cut_at_the_limit_as_they_stream(app, path: str, headers: dict,
                                                    limit: int) -> None:
    status, body, pulled = drive(app, path, {**headers, **KEY}, chunks=1024)  # 16 MiB
    assert status == 413 and body["error"]["code"] == "request_too_large"
    assert pulled == limit // CHUNK + 1  # stopped at the first chunk past the limit


def test_a_declared_oversized_body_is_refused_unread(app) -> None:
    headers = {**KEY, "content-type": "application/json", "content-length": str(10**9)}
    status, body, pulled = drive(app, "/v1/completions", headers, chunks=64)
    assert (status, body["error"]["code"], pulled) == (413, "request_too_large", 0)


def test_metrics_need_an_operator_key(tmp_path) -> None:
    with TestClient(make_app(tmp_path)) as client:
        assert client.get("/metrics").status_code == 401
        refused = client.get("/metrics", headers=KEY)
        assert refused.status_code == 403
        assert refused.json()["error"]["code"] == "admin_key_required"
        allowed = client.get("/metrics", headers={"Authorization": "Bearer sk-operator"})
        assert allowed.status_code == 200 and "symbiosis_requests_total" in allowed.text
        # the operator key is no tenant key
        assert client.get("/v1/files", headers={"Authorization": "Bearer sk-operator"}
                          ).status_code in (401, 403)


def test_public_metrics_answer_a_scraper_without_a_key(tmp_path) -> None:
    settings = GatewaySettings(data_dir=tmp_path, api_keys="acme=sk-acme", public_metrics=True,
                               manager="ipc:///tmp/symbiosis-test-no-manager.sock")
    with TestClient(create_app(settings)) as client:
        scraped = client.get("/metrics")
        assert scraped.status_code == 200 and "symbiosis_requests_total" in scraped.text
        assert client.get("/v1/models").status_code == 401  # nothing else opens


def test_a_body_past_the_tenants_requests_per_minute_is_refused_unread(tmp_path) -> None:
    app = create_app(GatewaySettings(data_dir=tmp_path, api_keys="acme=sk-acme",
                                     manager="ipc:///tmp/symbiosis-test-no-manager.sock",
                                     requests_per_minute=1, max_upload_bytes=256 * 1024))
    with TestClient(app):
        app.state.rate_limits = RateLimits(lambda: 1000.0)  # a still clock, the bucket full
        status, body, pulled = drive(app, "/v1/files", {**MULTIPART, **KEY}, chunks=2)
        assert status == 400 and pulled == 2  # the first: read (and no file of a form)
        answered: dict[str, str] = {}
        status, body, pulled = drive(app, "/v1/files", {**MULTIPART, **KEY}, 64, answered)
    assert (status, body["error"]["code"], pulled) == (429, "rate_limit_exceeded", 0)
    assert (answered["retry-after-ms"], answered["x-ratelimit-remaining-requests"]) == \
        ("60000", "0")


def test_a_body_declared_oversized_takes_none_of_the_tenants_requests(tmp_path) -> None:
    app = create_app(GatewaySettings(data_dir=tmp_path, api_keys="acme=sk-acme",
                                     manager="ipc:///tmp/symbiosis-test-no-manager.sock",
                                     requests_per_minute=1, max_upload_bytes=256 * 1024))
    oversized = {**KEY, "content-type": "application/json", "content-length": str(10**9)}
    with TestClient(app):
        app.state.rate_limits = RateLimits(lambda: 1000.0)  # a still clock, the bucket full
        for _ in range(3):
            status, body, _ = drive(app, "/v1/completions", oversized, chunks=64)
            assert (status, body["error"]["code"]) == (413, "request_too_large")
        answered: dict[str, str] = {}
        status, body, pulled = drive(app, "/v1/files", {**MULTIPART, **KEY}, 2, answered)
        assert (status, pulled) == (400, 2)  # the bucket's one request still there: taken now
        assert answered["x-ratelimit-remaining-requests"] == "0"
        status, body, _ = drive(app, "/v1/files", {**MULTIPART, **KEY}, 2)
    assert (status, body["error"]["code"]) == (429, "rate_limit_exceeded")

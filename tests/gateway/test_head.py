"""HEAD is answered as GET without the body, wherever GET is (auth and all); elsewhere a 405.
A 405 names every method its path takes."""

from __future__ import annotations

import logging

import pytest

from tests.gateway.conftest import KEY
from tests.gateway.test_validation import assert_openai_error


@pytest.mark.parametrize("path", ["/health", "/v1/models", "/v1/models/tiny-llama", "/v1/files",
                                  "/v1/fine_tuning/jobs"])
def test_head_answers_as_get_with_no_body(client, path: str, caplog) -> None:
    got = client.get(path, headers=KEY)
    with caplog.at_level(logging.INFO, logger="gateway"):
        head = client.head(path, headers=KEY)
    assert f"HEAD {path} -> 200" in caplog.text
    assert got.status_code == head.status_code == 200 and got.content
    assert head.content == b""
    assert head.headers["content-length"] == got.headers["content-length"] == \
        str(len(got.content))
    assert head.headers["content-type"] == got.headers["content-type"]


def test_head_keeps_gets_refusals_and_post_routes_refuse_it(client) -> None:
    for path, status in (("/v1/models", 401), ("/v1/models/nobody/x", 404),
                         ("/v1/completions", 405)):
        head = client.head(path, headers={} if status == 401 else KEY)
        assert head.status_code == status and head.content == b""
        assert head.headers["content-length"] != "0"  # GET's error body, counted, not sent
    assert assert_openai_error(client.post("/v1/models", headers=KEY), 405)


def test_405_says_what_is_allowed(client) -> None:
    response = client.put("/v1/models", headers=KEY)
    assert assert_openai_error(response, 405)["type"] == "invalid_request_error"
    assert response.headers["allow"] == "GET"
    response = client.options("/v1/files/file-x", headers=KEY)  # two routes share this path
    assert response.headers["allow"] == "DELETE, GET"
    chat = client.options("/v1/chat/completions/chatcmpl-x", headers=KEY)
    assert chat.headers["allow"] == "DELETE, GET, POST"
    for method in ("GET", "DELETE", "OPTIONS"):  # the count's path names no response
        count = client.request(method, "/v1/responses/input_tokens", headers=KEY)
        assert assert_openai_error(count, 405) and count.headers["allow"] == "POST"
    missing = client.get("/v1/responses/resp_x", headers=KEY)
    assert assert_openai_error(missing, 404)["code"] == "response_not_found"

"""RequestContext, the gateway's middleware of request ids, body checks, answer headers and
metrics, driven as the ASGI server drives it: a streamed answer's chunks reach the server from
the route's own task, with nothing between them (Starlette's `BaseHTTPMiddleware` ran the route
in a task of its own and passed every chunk over a stream); a body read for its check reaches
the route whole and unchanged; a body that is not UTF-8 is refused before the route runs; a
client's id of kilobytes is cut before it is echoed or logged."""

from __future__ import annotations

import asyncio
import json
import logging
from types import SimpleNamespace

from gateway.metrics import Metrics
from gateway.rate_limits import RateLimits
from gateway.request_context import ID_CHARS, RequestContext
from tests.gateway.conftest import KEY


def scope(path: str = "/v1/chat/completions", request_id: bytes = b"req-1") -> dict:
    return {"type": "http", "method": "POST", "path": path, "raw_path": path.encode(),
            "query_string": b"", "root_path": "", "scheme": "http", "http_version": "1.1",
            "server": ("testserver", 80), "headers": [(b"x-request-id", request_id)]}


class Echo:
    """A route that reads its whole body and streams it back in three chunks, noting its task."""

    def __init__(self) -> None:
        self.task: asyncio.Task | None = None
        self.called = False

    async def __call__(self, scope, receive, send) -> None:
        self.called, self.task = True, asyncio.current_task()
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body", False):
                break
        await send({"type": "http.response.start", "status": 200, "headers": []})
        third = len(body) // 3
        for k, part in enumerate((body[:third], body[third:2 * third], body[2 * third:])):
            await send({"type": "http.response.body", "body": part, "more_body": k < 2})


def run(app, scope: dict, parts: list[bytes]) -> list[tuple[dict, asyncio.Task | None]]:
    """The messages `app` sent the server for a body sent in `parts`, each with its sender's
    task."""
    incoming = [{"type": "http.request", "body": part, "more_body": k < len(parts) - 1}
                for k, part in enumerate(parts)]
    sent = []

    async def receive() -> dict:
        return incoming.pop(0) if incoming else {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        sent.append((message, asyncio.current_task()))

    asyncio.run(app(scope, receive, send))
    return sent


def requests_counted(state, route: str, status: str) -> float:
    return state.metrics.registry.get_sample_value(
        "symbiosis_requests_total", {"route": route, "status": status, "tenant": "-"}) or 0.0


def test_a_streamed_answer_goes_from_the_routes_task_to_the_server_and_the_body_arrives_whole():
    state, route = SimpleNamespace(metrics=Metrics(), rate_limits=RateLimits()), Echo()
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "héllo"}]})
    encoded = body.encode()
    sent = run(RequestContext(route, state), scope(), [encoded[:7], encoded[7:20], encoded[20:]])
    start, *chunks = [message for message, _ in sent]
    assert start["status"] == 200 and (b"x-request-id", b"req-1") in start["headers"]
    assert b"".join(c["body"] for c in chunks).decode() == body
    assert [c["more_body"] for c in chunks] == [True, True, False]
    assert {task for _, task in sent} == {route.task}  # no task between the route and server
    assert requests_counted(state, "unmatched", "200") == 1.0


def test_a_body_that_is_not_utf8_is_refused_before_the_route_runs():
    state, route = SimpleNamespace(metrics=Metrics(), rate_limits=RateLimits()), Echo()
    sent = run(RequestContext(route, state), scope(request_id=b"req-2"), [b'{"model": "\xff"}'])
    start, body = [message for message, _ in sent]
    assert not route.called
    assert start["status"] == 400 and (b"x-request-id", b"req-2") in start["headers"]
    assert json.loads(body["body"])["error"]["code"] == "invalid_encoding"
    assert requests_counted(state, "unmatched", "400") == 1.0


def test_a_path_with_a_control_character_is_no_route_and_other_bodies_pass_unread():
    state, route = SimpleNamespace(metrics=Metrics(), rate_limits=RateLimits()), Echo()
    start = run(RequestContext(route, state), scope("/v1/models/m\n"), [b"x"])[0][0]
    assert start["status"] == 404 and not route.called
    sent = run(RequestContext(route, state), scope("/v1/files"), [b"\xff\xfe", b"raw"])
    assert b"".join(m.get("body", b"") for m, _ in sent[1:]) == b"\xff\xferaw"


def test_a_long_request_id_comes_back_and_is_logged_cut(client, caplog) -> None:
    """Alike for a request that is answered and for one whose body the guard refuses before
    any route reads it (no key)."""
    sent = "".join(chr(ord("a") + i % 26) for i in range(12_000))
    caplog.set_level(logging.INFO, logger="gateway")
    for method, headers, status in (("GET", KEY, 200), ("POST", {}, 401)):
        answer = client.request(method, "/v1/models", headers={**headers, "x-request-id": sent})
        assert answer.status_code == status
        assert answer.headers["x-request-id"] == sent[:ID_CHARS]
    lines = [r.getMessage() for r in caplog.records if sent[:ID_CHARS] in r.getMessage()]
    assert len(lines) == 2 and all(sent[:ID_CHARS + 1] not in line for line in lines)
    assert client.get("/v1/models", headers={**KEY, "x-request-id": "mine"}).headers[
        "x-request-id"] == "mine"

"""RequestContext: each request's id, its checks before any route (a path with a control
character, a JSON body that is not UTF-8), and when its answer starts: the `x-request-id` and
rate-limit headers, the request's metrics and its log line.

A plain ASGI middleware, not Starlette's `BaseHTTPMiddleware`: that one runs the route in a task
of its own and passes a streamed answer's every chunk through a memory stream between the two
(an event-loop hop a token); here the answer's messages go straight to the server, only its start
read on the way."""

from __future__ import annotations

import logging
import time
import uuid

from starlette.datastructures import MutableHeaders
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.errors import APIError
from gateway.head import ASKED

log = logging.getLogger("gateway")
JSON_BODIES = ("/v1/completions", "/v1/chat/completions", "/v1/fine_tuning")
ID_CHARS = 128  # of a client's x-request-id, kept as the request's id


def request_id(header: str | None) -> str:
    """The request's id, echoed and logged: the client's `x-request-id`, cut at `ID_CHARS` (a
    header of kilobytes would otherwise stand whole in each of the request's log lines), or a
    fresh one."""
    return header[:ID_CHARS] if header else uuid.uuid4().hex


class RequestContext:
    def __init__(self, app: ASGIApp, state) -> None:
        self.app, self.state = app, state  # the app's state: its metrics and rate limits

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        request.state.request_id = request_id(request.headers.get("x-request-id"))
        started = time.monotonic()

        async def answer(message: Message) -> None:
            if message["type"] == "http.response.start":
                self._started(request, message, started)
            await send(message)

        try:
            _check_path(scope)
            receive = await _checked_utf8(scope, receive)
        except APIError as exc:
            await exc.response()(scope, receive, answer)
            return
        request.state.received = time.monotonic()  # all of it: a completion's TTFT starts
        await self.app(scope, receive, answer)

    def _started(self, request: Request, message: Message, started: float) -> None:
        """The answer starts: its headers named, the request counted and logged."""
        state, status = request.state, message["status"]
        path = getattr(request.scope.get("route"), "path", "unmatched")
        tenant = getattr(state, "tenant", "-")
        self.state.metrics.requests.labels(path, str(status), tenant).inc()
        self.state.metrics.latency.labels(path).observe(time.monotonic() - started)
        headers = MutableHeaders(scope=message)
        headers["x-request-id"] = state.request_id
        if (limited := getattr(state, "rate_limited", None)) is not None:
            headers.update(self.state.rate_limits.headers(limited))
        log.info("request %s %s %s -> %d (%.0f ms, tenant %s)", state.request_id,
                 request.scope.get(ASKED, request.method), request.url.path, status,
                 1e3 * (time.monotonic() - started), tenant)


def _check_path(scope: Scope) -> None:
    """A path with a control character is no URL of ours: the router's `{model:path}` would match
    `tiny-llama\\n` as `tiny-llama` (its pattern's `$` lets a final newline through)."""
    if any(ord(c) < 32 or c == "\x7f" for c in scope["path"]):
        raise APIError(404, "Unknown request URL. Please check the URL and method.")


async def _checked_utf8(scope: Scope, receive: Receive) -> Receive:
    """Refuse a non-UTF-8 JSON body before any parsing (BodyGuard has authenticated the request
    and bounds the body): read whole, then given to the route as it came."""
    if scope["method"] not in ("POST", "PUT", "PATCH") or \
            not scope["path"].startswith(JSON_BODIES):
        return receive
    messages: list[Message] = []
    while True:
        message = await receive()
        messages.append(message)
        if message["type"] != "http.request" or not message.get("more_body", False):
            break
    try:
        b"".join(m.get("body", b"") for m in messages).decode("utf-8")
    except UnicodeDecodeError:
        raise APIError(400, "The request body is not valid UTF-8.", "invalid_encoding") from None

    async def replay() -> Message:
        return messages.pop(0) if messages else await receive()

    return replay

"""BodyGuard: authenticate a request before reading its body, then count the body as it streams.

An ASGI middleware (outermost), so nothing reads a byte of a body before it runs:
- a request with a body to /v1/ without a valid key gets its 401 before any of the body is read,
  and one past its tenant's requests per minute its 429 (`rate_limits`);
- a declared Content-Length over the limit (a form's: the largest upload and its framing) gets
  its 413 at once, and takes none of the tenant's requests per minute;
- a body without a declared length (chunked) is counted as it arrives; the first chunk past the
  limit ends the request with a 413, whatever the route was doing with it (JSON or multipart).
"""

from __future__ import annotations

import json
import logging

from gateway.errors import APIError
from gateway.rate_limits import count_request
from gateway.request_context import request_id
from gateway.settings import GatewaySettings
from gateway.tenants import OPERATOR, TenantDirectory

log = logging.getLogger("gateway")
FORM_FRAMING = 64 * 1024  # a form's boundaries and fields beside a file of the largest size (the
# route counts the file itself against `max_upload_bytes`)
BODY_METHODS = {"POST", "PUT", "PATCH"}


class BodyTooLarge(Exception):
    pass


IN_PROCESS_TENANT = "symbiosis.in_process_tenant"  # the tenant of a request the gateway makes
# of itself (a batch's line, a background response: `gateway.in_process`); no client sets a
# scope's keys


def authenticate(authorization: str, tenants: TenantDirectory):
    """The tenant a bearer key belongs to, or the OpenAI-shaped 401."""
    scheme, _, key = authorization.partition(" ")
    if scheme.lower() != "bearer" or not key.strip():
        raise APIError(401, "You didn't provide an API key. Provide it in the Authorization "
                       "header as 'Bearer YOUR_KEY'.", "missing_api_key")
    found = tenants.authenticate(key.strip())
    if found is None:
        raise APIError(401, "Incorrect API key provided.", "invalid_api_key")
    return found


def too_large(limit: int) -> APIError:
    return APIError(413, f"The request body is larger than {limit} bytes.", "request_too_large")


class BodyGuard:
    def __init__(self, app, settings: GatewaySettings) -> None:
        self.app = app
        self.settings = settings

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope["method"] not in BODY_METHODS:
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1")
                   for k, v in scope["headers"]}
        multipart = headers.get("content-type", "").startswith("multipart/")
        limit = self.settings.max_upload_bytes + FORM_FRAMING if multipart \
            else self.settings.max_body_bytes
        limited = None
        try:
            if scope["path"].startswith("/v1/") and IN_PROCESS_TENANT not in scope:
                found = authenticate(headers.get("authorization", ""), scope["app"].state.tenants)
                if found.id != OPERATOR:
                    limited = found
            declared = headers.get("content-length", "")
            if declared.isdigit() and int(declared) > limit:
                raise too_large(limit)  # before the count: a request refused unread takes none
            if limited is not None:
                count_request(scope["app"].state, scope, limited)
        except APIError as refused:
            limits = scope["app"].state.rate_limits.headers(limited) if limited else {}
            await _refuse(scope, headers, send, refused, {**refused.headers, **limits})
            return
        await self._counted(scope, headers, receive, send, limit)

    async def _counted(self, scope, headers: dict[str, str], receive, send, limit: int) -> None:
        seen = 0
        overflow = False
        started = False

        async def counting_receive():
            nonlocal seen, overflow
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    overflow = True
                    raise BodyTooLarge
            return message

        async def guarded_send(message) -> None:
            nonlocal started
            if overflow:
                return  # the route's reaction to the cut body is replaced by the 413
            started = True
            await send(message)

        try:
            await self.app(scope, counting_receive, guarded_send)
        except Exception:  # BodyTooLarge, possibly wrapped in a task group's ExceptionGroup
            if not overflow:
                raise
        if overflow and not started:
            await _refuse(scope, headers, send, too_large(limit))


async def _refuse(scope, headers: dict[str, str], send, error: APIError,
                  more: dict[str, str] | None = None) -> None:
    """Answer with `error` (with a request id and `more` headers, logged and counted like any
    other request)."""
    answer_id = request_id(headers.get("x-request-id"))
    log.info("request %s %s %s -> %d (%s; body not read)", answer_id, scope["method"],
             scope["path"], error.status, error.code)
    scope["app"].state.metrics.requests.labels("unmatched", str(error.status), "-").inc()
    body = json.dumps(error.body()).encode()
    await send({"type": "http.response.start", "status": error.status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode()),
                            (b"x-request-id", answer_id.encode()),
                            (b"connection", b"close"),
                            *((k.encode(), v.encode()) for k, v in (more or {}).items())]})
    await send({"type": "http.response.body", "body": body})

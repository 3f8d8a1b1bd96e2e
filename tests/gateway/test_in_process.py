"""Requests the gateway makes of itself (`gateway.in_process`), against a small ASGI app that
answers as the endpoints do: the tenant in the request's scope, the body as sent, the answer
whole; a client that leaves is a disconnect the app sees; a caller cancelled while the app
answers (as the generation path does, a 499 for a client gone) is cancelled, not answered."""

from __future__ import annotations

import asyncio
import contextlib
import json

import pytest

from gateway import in_process
from gateway.guard import IN_PROCESS_TENANT


async def app(scope, receive, send) -> None:
    """Echoes the request; "wait" waits for the client to leave (or for a cancel, taken as
    the generation path takes it: the client left, a 499)."""
    body = json.loads((await receive())["body"])
    status = 200
    if body.get("wait"):
        with contextlib.suppress(asyncio.CancelledError):
            assert (await receive())["type"] == "http.disconnect"
        status = 499
    answer = json.dumps({"tenant": scope[IN_PROCESS_TENANT], "path": scope["path"],
                         "body": body, "extra": scope.get("extra")}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"x-request-id", b"r1")]})
    await send({"type": "http.response.body", "body": answer[:5], "more_body": True})
    await send({"type": "http.response.body", "body": answer[5:]})


def test_a_request_is_answered_whole_as_its_tenant() -> None:
    status, headers, content = asyncio.run(in_process.post(
        app, "acme", "/v1/responses", b'{"a": 1}', scope={"extra": 7}))
    assert (status, headers["x-request-id"]) == (200, "r1")
    assert json.loads(content) == {"tenant": "acme", "path": "/v1/responses",
                                   "body": {"a": 1}, "extra": 7}


def test_a_client_that_leaves_is_a_disconnect() -> None:
    async def leaving() -> int:
        leave = asyncio.Event()
        call = asyncio.ensure_future(in_process.post(app, "acme", "/x", b'{"wait": 1}',
                                                     leave=leave))
        await asyncio.sleep(0.05)
        assert not call.done()
        leave.set()
        return (await call)[0]

    assert asyncio.run(leaving()) == 499


def test_a_caller_cancelled_while_the_app_answers_is_cancelled() -> None:
    async def cancelled() -> None:
        call = asyncio.ensure_future(in_process.post(app, "acme", "/x", b'{"wait": 1}'))
        await asyncio.sleep(0.05)
        call.cancel()
        await call

    with pytest.raises(asyncio.CancelledError):
        asyncio.run(cancelled())

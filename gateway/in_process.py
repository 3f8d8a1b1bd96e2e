"""Requests the gateway makes of itself, as a tenant: a batch's lines (`gateway.batch_runner`)
and background responses (`gateway.background`) go through the app in process, so that each is
checked, limited, served and answered exactly as the endpoint answers a client."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from gateway.guard import IN_PROCESS_TENANT


async def post(app, tenant: str, path: str, data: bytes, *, scope: dict[str, Any] | None = None,
               leave: asyncio.Event | None = None,
               streamed: Callable[[bytes], None] | None = None) -> \
        tuple[int, dict[str, str], bytes]:
    """POST `data` (JSON) to the app at `path` as `tenant`: (status, headers, body). `scope`:
    keys added to the request's scope; `leave`: once set, the request's client goes away (as
    one that disconnects), else it waits for the whole answer; `streamed`: given each part of
    a 200's body as it comes (which the body returned then leaves out). Cancelled (the gateway
    stopping), it is cancelled, whatever the app answered its client that left (a 499): the
    request was not answered, to be run again."""
    made = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
            "method": "POST", "scheme": "http", "path": path, "raw_path": path.encode(),
            "root_path": "", "query_string": b"", "client": ("in-process", 0),
            "server": ("in-process", 0), **(scope or {}), IN_PROCESS_TENANT: tenant,
            "headers": [(b"host", b"in-process"), (b"content-type", b"application/json"),
                        (b"content-length", str(len(data)).encode())]}
    answered, sent = asyncio.Event(), False
    start: dict = {}
    chunks: list[bytes] = []

    async def receive() -> dict:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": data, "more_body": False}
        waits = [asyncio.ensure_future(event.wait()) for event in (answered, leave) if event]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        if message["type"] == "http.response.start":
            start.update(message)
        elif message["type"] == "http.response.body":
            if streamed is not None and start.get("status") == 200:
                if message.get("body"):
                    streamed(message["body"])
            else:
                chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                answered.set()

    try:
        await app(made, receive, send)
    finally:
        answered.set()
    task = asyncio.current_task()
    if task is not None and task.cancelling():  # the app took the cancel as a client leaving
        raise asyncio.CancelledError
    headers = {k.decode().lower(): v.decode() for k, v in start.get("headers", [])}
    return start.get("status", 500), headers, b"".join(chunks)


def retry_s(headers: dict[str, str], otherwise: float) -> float:
    """How long a 429 says to wait (a rate limit's `retry-after-ms`: its tenant's minute must
    refill first), else `otherwise` (a request finishing elsewhere ends the others' 429s)."""
    try:
        return max(otherwise, float(headers["retry-after-ms"]) / 1000)
    except (KeyError, ValueError):
        return otherwise

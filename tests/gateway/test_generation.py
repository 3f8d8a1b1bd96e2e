"""A generated stream lets go of what its request held once it ends, even where its body never
began: starlette's own response, sent through a `send` that yields as the gateway's middleware
does, to a client gone before the first chunk."""

from __future__ import annotations

import asyncio

from starlette.responses import StreamingResponse

from gateway.generation import Stream

SCOPE = {"type": "http", "asgi": {"spec_version": "2.3"}}  # uvicorn's


def sent(kind: type, client_gone: bool) -> list[str]:
    """What happened: the body's start, its end, the request's hold let go."""
    seen: list[str] = []

    async def body():
        seen.append("began")
        try:
            yield b"data: 1\n\n"
        finally:
            seen.append("body ended")

    async def ended() -> None:
        seen.append("let go")

    async def receive() -> dict:
        if not client_gone:
            await asyncio.sleep(3600)
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        await asyncio.sleep(0)

    response = kind(body(), ended=ended) if kind is Stream else kind(body())
    asyncio.run(response(SCOPE, receive, send))
    return seen


def test_a_stream_lets_go_even_where_its_body_never_began() -> None:
    assert sent(StreamingResponse, client_gone=True) == []  # what the plain one misses
    assert sent(Stream, client_gone=True) == ["let go"]
    assert sent(Stream, client_gone=False) == ["began", "body ended", "let go"]

"""HEAD answered as GET without its body: HTTP asks it of every GET route (monitors and proxies
probe with it), and FastAPI's routes take only the methods they name (a HEAD was a 405)."""

from __future__ import annotations

ASKED = "symbiosis.asked"  # the scope's method as the client sent it (for the log)


class HeadAsGet:
    """An ASGI middleware: a HEAD runs as a GET; its answer keeps the status and the headers
    (Content-Length too) and sends no body."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope["method"] != "HEAD":
            await self.app(scope, receive, send)
            return

        async def headers_only(message: dict) -> None:
            if message["type"] == "http.response.body":
                if message.get("more_body", False):
                    return
                message = {"type": "http.response.body", "body": b"", "more_body": False}
            await send(message)

        await self.app({**scope, "method": "GET", ASKED: "HEAD"}, receive, headers_only)

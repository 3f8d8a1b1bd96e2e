"""A streamed background response's events (`background` with `stream`), kept by the gateway
that runs it as its run sends them, so that the client that created it and any that come back
(`GET /v1/responses/{id}?stream=true&starting_after=N`) follow the one stream: as OpenAI's, it
opens with `response.created` and `response.queued` (the response queued), then the run's own
events from `response.in_progress` on (its `response.created` left out), numbered on; each
event is one SSE block, its index its `sequence_number`. Kept `KEPT_S` after the run ends."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

from gateway.responses import sse

KEPT_S = 300.0


class Events:
    def __init__(self, queued: dict) -> None:
        """`queued`: the response as queued."""
        self.blocks: list[bytes] = []
        self.ended = False
        self._more = asyncio.Event()
        for kind in ("response.created", "response.queued"):
            self.add({"type": kind, "response": queued})

    def add(self, event: dict) -> None:
        self.blocks.append(sse({**event, "sequence_number": len(self.blocks)}))
        self._wake()

    def run_sent(self, block: bytes) -> None:
        """An SSE block of the run's stream (one event), numbered on."""
        event = json.loads(block.decode().split("data: ", 1)[1])
        if event.get("type") != "response.created":
            self.add(event)

    def end(self) -> None:
        self.ended = True
        self._wake()

    async def follow(self, after: int | None = None) -> AsyncIterator[bytes]:
        """The events past sequence number `after` (all without it), then each as it comes,
        until the run ends."""
        k = 0 if after is None else after + 1
        while True:
            more = self._more
            while k < len(self.blocks):
                yield self.blocks[k]
                k += 1
            if self.ended:
                return
            await more.wait()

    def _wake(self) -> None:
        self._more.set()
        self._more = asyncio.Event()

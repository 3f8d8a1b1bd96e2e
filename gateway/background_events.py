"""A streamed background response's events (`background` with `stream`), kept by the gateway
that runs it as its run sends them, so that the client that created it and any that come back
(`GET /v1/responses/{id}?stream=true&starting_after=N`) follow the one stream: each event is
one SSE block, its index its `sequence_number`. Kept `KEPT_S` after the run ends."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

KEPT_S = 300.0


class Events:
    def __init__(self) -> None:
        self.blocks: list[bytes] = []
        self.ended = False
        self._more = asyncio.Event()

    def add(self, block: bytes) -> None:
        self.blocks.append(block)
        self._wake()

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

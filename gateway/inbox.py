"""A request's replies from the worker manager as they arrive, and its one reader's wait for the
next: what `asyncio.Queue` does for a single reader, without the queue's events and locks made for
each request (their creation alone was ~10 % of the gateway's busy time in a 512-input embeddings
request) or a timeout context at each wait."""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any


class Inbox:
    __slots__ = ("_items", "_waiter")

    def __init__(self) -> None:
        self._items: deque[Any] = deque()
        self._waiter: asyncio.Future | None = None

    def __len__(self) -> int:  # the items waiting
        return len(self._items)

    def put(self, item: Any) -> None:
        """Keep `item` (never None) and wake the reader if it waits."""
        self._items.append(item)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def get(self, timeout_s: float) -> Any:
        """The next item, at once where one waits; else the first to come within `timeout_s`,
        or None. A cancel while waiting is raised (the item that met it stays for a next get)."""
        if not self._items:
            loop = asyncio.get_running_loop()
            waiter = self._waiter = loop.create_future()
            timer = loop.call_later(timeout_s, _expire, waiter)
            try:
                await waiter
            finally:
                timer.cancel()
                self._waiter = None
            if not self._items:
                return None
        return self._items.popleft()


def _expire(waiter: asyncio.Future) -> None:
    if not waiter.done():
        waiter.set_result(None)

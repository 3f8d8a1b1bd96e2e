"""A conversation's turn: one response at a time goes on in a conversation, from before its
items are read until its own are added (or it ends otherwise), so that each response reads the
turns before it and none is added amid another. A second one meanwhile is refused as OpenAI's
is: 400 `conversation_locked`; a background one's run waits for it (`wait`) and hands it to
the request it makes (`HELD`). The turns are this gateway's (the stack serves through one)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from gateway.errors import APIError

LOCKED = "conversation_locked"
HELD = "symbiosis.turn"  # scope key: the turn a background run took for its request
WAIT_S = 0.05  # how often a waiting run looks again


class Turns:
    def __init__(self) -> None:
        self.held: dict[tuple[str, str], object] = {}  # (tenant, conversation) -> its holder

    def take(self, tenant: str, conversation_id: str) -> Callable[[], None]:
        """The conversation's turn, and how to give it back (once; again is nothing); else
        the 400 `conversation_locked`."""
        key, holder = (tenant, conversation_id), object()
        if key in self.held:
            raise APIError(400, "Another process is currently operating on this conversation. "
                           "Please retry in a few seconds.", LOCKED, "conversation")
        self.held[key] = holder

        def give() -> None:
            if self.held.get(key) is holder:
                del self.held[key]
        return give

    async def wait(self, tenant: str, conversation_id: str,
                   leave: asyncio.Event) -> Callable[[], None] | None:
        """The conversation's turn once it is free (None if `leave` is set first)."""
        while True:
            try:
                return self.take(tenant, conversation_id)
            except APIError:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(leave.wait(), WAIT_S)
                    return None

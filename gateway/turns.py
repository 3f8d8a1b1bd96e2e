"""A conversation's turn: one response at a time goes on in a conversation, from before its
items are read until its own are added (or it ends otherwise), so that each response reads the
turns before it and none is added amid another. A second one meanwhile is refused as OpenAI's
is: 400 `conversation_locked` (a background one waits its turn instead, `gateway.background`).
The turns are this gateway's (the stack serves through one)."""

from __future__ import annotations

from collections.abc import Callable

from gateway.errors import APIError

LOCKED = "conversation_locked"


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

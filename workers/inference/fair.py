"""The waiting requests of an engine, in turns: each tenant's requests take turns with the
others' (in a shared worker; a worker of one tenant's is first come, first served). A request's
turn is one after its tenant's last request's, and not before the turn of the request at the
head, so a tenant that sends 2,048 prompts at once (one request's, or many requests') holds one
place in each turn, not the 2,048 ahead of everyone who comes after: a tenant's request that
arrives behind them goes in after the head's turn, and is admitted (or embedded) in the next
steps. Within a turn, first come, first served."""

from __future__ import annotations

from collections import deque

from workers.inference.request import Request


class FairQueue(deque[Request]):
    def __init__(self) -> None:
        super().__init__()
        self.last: dict[str, int] = {}  # tenant -> the turn of its latest request
        self.latest = 0  # the latest turn given

    def add(self, request: Request) -> None:
        """`request` in its turn, behind every request waiting of an earlier or equal turn."""
        floor = self[0].turn if self else self.latest
        request.turn = max(floor, self.last.get(request.tenant, floor - 1) + 1)
        self.last[request.tenant] = request.turn
        self.latest = max(self.latest, request.turn)
        place = len(self)
        while place and self[place - 1].turn > request.turn:
            place -= 1
        self.insert(place, request)

    def drop(self, request_id: str) -> None:
        """The request of this id taken out, if it waits."""
        for request in [r for r in self if r.id == request_id]:
            self.remove(request)

"""The waiting requests of an engine, in turns: each tenant's requests take turns with the
others' (in a shared worker; a worker of one tenant's is first come, first served). A request's
turn is one after its tenant's last request's, and not before the turn of the request at the
head, so a tenant that sends 2,048 prompts at once (one request's, or many requests') holds one
place in each turn, not the 2,048 ahead of everyone who comes after: a tenant's request that
arrives behind them goes in after the head's turn, and is admitted (or embedded) in the next
steps. Within a turn, first come, first served.

A tenant's place in each turn goes round its API requests (`Request.group`: the prompts of one
request share it): a chat completion sent behind the same tenant's 2,048-input embeddings request
takes the tenant's next place but one, not its 2,049th. The places are handed round lazily
(`settle`, once before a step, for the tenants that had requests added): a request's 2,048 prompts
come one by one, and each of its tenant's places keeps its turn and its spot in the queue; only
which of the tenant's requests holds it changes. Prompts without a group are one group.

Flex requests (`SamplingParams.flex`: a client's `service_tier: "flex"`, a Batch API line) wait
behind every other: they take their turns among themselves, after the last interactive one, and
take at most `wire.manager.FLEX_SHARE` of an engine's seats (`flex_seats`), so that an
interactive request that comes while they run finds a seat free at the next step."""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections import deque
from collections.abc import Collection
from itertools import chain, zip_longest

from wire.manager import flex_seats
from workers.inference.request import Request

FLEX = 1 << 48  # the flex requests' turns start here: after every interactive one's


def _turn(request: Request) -> int:
    return request.turn


def _tenant(request: Request) -> tuple[bool, str]:
    """Whose turns it takes: its tenant's in its tier."""
    return request.params.flex, request.tenant


class FairQueue(deque[Request]):
    def __init__(self) -> None:
        super().__init__()
        self.last: dict[tuple[bool, str], int] = {}  # (flex, tenant) -> its latest request's turn
        self.latest = {False: 0, True: FLEX}  # the latest turn given, per tier
        self.group: dict[tuple[bool, str], str] = {}  # (flex, tenant) -> its latest's group
        self.mixed: set[tuple[bool, str]] = set()  # tenants of several groups when last settled
        self.unsettled: set[tuple[bool, str]] = set()  # tenants whose places go round again

    def add(self, request: Request) -> None:
        """`request` in its turn, behind every request waiting of an earlier or equal turn."""
        key = _tenant(request)
        flex = key[0]
        head = bisect_left(self, FLEX, key=_turn) if flex else 0  # its tier's first, if any
        floor = self[head].turn if head < len(self) and (flex or self[head].turn < FLEX) \
            else self.latest[flex]
        request.turn = max(floor, self.last.get(key, floor - 1) + 1)
        self.last[key] = request.turn
        self.latest[flex] = max(self.latest[flex], request.turn)
        self.insert(bisect_right(self, request.turn, key=_turn), request)
        if key in self.mixed or self.group.get(key, request.group) != request.group:
            self.unsettled.add(key)
        self.group[key] = request.group

    def settle(self) -> None:
        """Each tenant added to since the last settle: its places, in their order, handed
        round its groups (in the order of their first place), a place a group at a time."""
        if not self.unsettled:
            return
        waiting, places = list(self), {}
        for i, request in enumerate(waiting):
            if (key := _tenant(request)) in self.unsettled:
                places.setdefault(key, []).append(i)
        for key, where in places.items():
            groups: dict[str, list[Request]] = {}
            for i in where:
                groups.setdefault(waiting[i].group, []).append(waiting[i])
            (self.mixed.add if len(groups) > 1 else self.mixed.discard)(key)
            turns = [waiting[i].turn for i in where]
            rounds = chain.from_iterable(zip_longest(*groups.values()))
            for i, turn, request in zip(where, turns, [r for r in rounds if r is not None],
                                        strict=True):
                request.turn, waiting[i] = turn, request
        self.mixed -= self.unsettled - places.keys()  # none of theirs waits any more
        self.unsettled.clear()
        self.clear()
        self.extend(waiting)

    def drop(self, request_ids: Collection[str]) -> None:
        """The waiting requests of these ids taken out, in one pass however many (a request's
        2,048 prompts are aborted together)."""
        kept = [r for r in self if r.id not in request_ids]
        if len(kept) < len(self):
            self.clear()
            self.extend(kept)

    def seat(self, running: list[Request], chunking: list[Request],
             max_batch: int) -> deque[Request]:
        """The requests at the head that take the seats left beside the sequences `running`
        (a request's each) and the prompts `chunking` in (theirs to come), up to the first
        embedding; flex ones within their seats (one alone where no other flex one runs)."""
        seats = len(running) + sum(r.params.n for r in chunking)
        flex = sum(r.params.flex for r in running) + \
            sum(r.params.n for r in chunking if r.params.flex)
        admitted: deque[Request] = deque()
        while self and not self[0].params.embed:
            n, flexed = self[0].params.n, self[0].params.flex
            if seats + n > max_batch or (flexed and flex and flex + n > flex_seats(max_batch)):
                break
            seats, flex = seats + n, flex + n * flexed
            admitted.append(self.popleft())
        return admitted

    def flex_only(self, running: list[Request], chunking: list[Request]) -> bool:
        """Whether every request waiting (an interactive one would be first), running and
        coming in by chunks is flex: then a step's calls are flex ones (`Call.flex`)."""
        return (not self or self[0].params.flex) and all(r.params.flex for r in running) and \
            all(r.params.flex for r in chunking)

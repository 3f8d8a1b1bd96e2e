"""The requests a worker has received and not yet taken into an engine. They come in frames (a
request's prompts in one: 2,048 of an embeddings request) and are taken one at a time between
the engines' steps; the API requests they belong to (`Generate.group`, as `fair.py` groups an
engine's queue; prompts without a group are one group) take turns, so that a chat that comes
behind a 2,048-input request is taken next, not after it."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator

from wire import manager as W


class Intake:
    def __init__(self) -> None:
        self._groups: dict[str, deque[W.Generate]] = {}  # in turn order: the next at the front

    def __len__(self) -> int:
        return sum(len(requests) for requests in self._groups.values())

    def __bool__(self) -> bool:
        return bool(self._groups)

    def __iter__(self) -> Iterator[W.Generate]:
        for requests in list(self._groups.values()):
            yield from requests

    def extend(self, requests: list[W.Generate]) -> None:
        for request in requests:
            self._groups.setdefault(request.group, deque()).append(request)

    def take(self) -> W.Generate:
        """The next group's first request; the group's turn comes again after the others'."""
        group = next(iter(self._groups))
        requests = self._groups.pop(group)
        request = requests.popleft()
        if requests:
            self._groups[group] = requests
        return request

    def drop(self, request_ids: set[str]) -> None:
        """The requests of these ids are never taken."""
        for group, requests in list(self._groups.items()):
            kept = deque(r for r in requests if r.id not in request_ids)
            if kept:
                self._groups[group] = kept
            else:
                del self._groups[group]

"""The requests in flight: which gateway asked, which worker serves each, and which the worker
has not answered yet (a worker that dies before answering them does not fail them: they go to a
fresh worker once)."""

from __future__ import annotations

from wire import manager as W
from workers.manager.pool import WorkerHandle, model_key

Route = tuple[bytes, str, str]  # (gateway, worker key, the tenant's model: model_key)


class Requests:
    def __init__(self) -> None:
        self.routes: dict[str, Route] = {}  # request id -> route
        self.unanswered: dict[str, tuple[W.Generate, int]] = {}  # request id -> (request, tries)

    def add(self, gateway: bytes, request: W.Generate, key: str, tries: int) -> None:
        self.routes[request.id] = (gateway, key, model_key(request.tenant, request.model))
        self.unanswered[request.id] = (request, tries)

    def drop(self, request_id: str) -> Route | None:
        self.unanswered.pop(request_id, None)
        return self.routes.pop(request_id, None)

    def drop_all(self, request_ids: list[str]) -> dict[str, list[str]]:
        """Drop each request; the ids of those that were in flight, by the worker of each."""
        by_worker: dict[str, list[str]] = {}
        for request_id in request_ids:
            route = self.drop(request_id)
            if route is not None:
                by_worker.setdefault(route[1], []).append(request_id)
        return by_worker

    def answer(self, message: W.Message) -> tuple[bytes, str] | None:
        """A worker's event for a request: the gateway to pass it to and the request's tenant
        and model as `model_key` (None: aborted); the request is answered now, and gone once
        Done or Failed."""
        route = self.routes.get(message.id)
        if route is None:
            return None
        self.unanswered.pop(message.id, None)
        if isinstance(message, (W.Done, W.Failed)):
            del self.routes[message.id]
        return route[0], route[2]

    def unanswered_on(self, handle: WorkerHandle) -> list[tuple[bytes, W.Generate, int]]:
        """The dead worker's requests it never answered and that were not retried before:
        taken off it, to be filed again (gateway, request, tries so far)."""
        retry = []
        for request_id in list(handle.inflight):
            request, tries = self.unanswered.get(request_id, (None, 0))
            route = self.routes.get(request_id)
            if request is None or route is None or tries > 1:
                continue
            handle.inflight.pop(request_id, None)
            self.drop(request_id)
            retry.append((route[0], request, tries))
        return retry

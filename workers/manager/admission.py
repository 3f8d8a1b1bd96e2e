"""What a request meets before it reaches a worker: its model's circuit breaker, and the
waiting room for a worker slot.

An open circuit refuses the request (503 `circuit_open`), or, for a tenant that allows fallback,
sends it to the base model; its Started then says so. A request that finds no slot it may take
yet (`NotYet`: busy, starting or young workers, or the eviction cap) waits, and is tried again
on each sweep, up to `capacity_wait_s`.
"""

from __future__ import annotations

import time

import msgspec

from wire import manager as W
from workers.manager.breaker import Breakers
from workers.manager.config import ManagerConfig
from workers.manager.pool import model_key

Waiting = tuple[bytes, W.Generate, int, float]  # (gateway, request, tries, waiting since)


class Admission:
    def __init__(self, config: ManagerConfig) -> None:
        self.base_model = config.model
        self.capacity_wait_s = config.capacity_wait_s
        self.breakers = Breakers(threshold=config.breaker_failures,
                                 cooldown_s=config.breaker_cooldown_s)
        self.fell_back: set[str] = set()  # requests served by the base model: circuit open
        self.waiting: dict[str, Waiting] = {}  # by request id (an abort takes one out at once)

    @staticmethod
    def received(request: W.Generate) -> W.Generate:
        """Stamped with when it reached the gateway (`arrived`: on this host's clock, which the
        workers share): the gateway's handling and waits here count against its first token."""
        request.arrived = time.monotonic() - request.waited_us * 1e-6
        return request

    def admit(self, request: W.Generate) -> W.Generate | W.Failed:
        """The request to serve (maybe rerouted to the base model), or why it is refused."""
        if request.adapter is None or \
                self.breakers.allow(model_key(request.tenant, request.model)):
            return request
        if not request.fallback:
            return W.Failed(request.id, 503, "circuit_open",
                            f"{request.model} failed {self.breakers.threshold} times in a row; "
                            f"it is refused for up to {self.breakers.cooldown_s:g} s, then tried "
                            "again")
        self.fell_back.add(request.id)
        return msgspec.structs.replace(request, model=self.base_model, adapter=None)

    def wait(self, gateway: bytes, request: W.Generate, tries: int, since: float | None,
             reason: Exception) -> W.Failed | None:
        """Queue the request for a slot; a 503 once it has waited too long."""
        since = time.monotonic() if since is None else since
        if time.monotonic() - since < self.capacity_wait_s:
            self.waiting[request.id] = (gateway, request, tries, since)
            return None
        return W.Failed(request.id, 503, "no_worker_capacity",
                        f"No worker slot freed up in time: {reason}")

    def due(self) -> list[Waiting]:
        """The waiting requests, to be tried again (those still without room come back)."""
        waiting, self.waiting = list(self.waiting.values()), {}
        return waiting

    def forget(self, request_id: str) -> None:
        self.waiting.pop(request_id, None)
        self.fell_back.discard(request_id)

    def observe(self, key: str, message: W.Message) -> None:
        """A worker's event for a request of model `key`: the breaker learns from its outcome,
        and a rerouted request's Started says it was served by the base model."""
        if isinstance(message, W.Started) and message.id in self.fell_back:
            message.fallback = True
        elif isinstance(message, W.Done):
            self.breakers.succeeded(key)
        elif isinstance(message, W.Failed) and message.status >= 500:
            self.breakers.failed(key)
        if isinstance(message, (W.Done, W.Failed)):
            self.fell_back.discard(message.id)

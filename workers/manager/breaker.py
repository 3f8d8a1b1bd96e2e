"""A circuit breaker per served model version (tenant, `name@N`): stop sending requests to what
keeps failing, and try again now and then.

Closed: requests pass. After `threshold` failures in a row (an adapter that does not load, a
worker that dies, a request the worker fails with a server error) it opens: requests are refused
at once, or served by the base model for tenants that allow fallback. After `cooldown_s` it is
half-open: one request is let through as a probe; its success closes the circuit, its failure
opens it again for another cool-down.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass
class Circuit:
    failures: int = 0
    opened_at: float | None = None
    probing: bool = False


class Breakers:
    def __init__(self, *, threshold: int = 3, cooldown_s: float = 30.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.threshold = threshold
        self.cooldown_s = cooldown_s
        self.clock = clock
        self.circuits: dict[str, Circuit] = {}

    def allow(self, key: str) -> bool:
        circuit = self.circuits.get(key)
        if circuit is None or circuit.opened_at is None:
            return True
        if circuit.probing or self.clock() - circuit.opened_at < self.cooldown_s:
            return False
        circuit.probing = True  # half-open: this request is the probe
        return True

    def failed(self, key: str) -> None:
        circuit = self.circuits.setdefault(key, Circuit())
        circuit.failures += 1
        if circuit.probing or circuit.failures >= self.threshold:
            circuit.opened_at, circuit.probing = self.clock(), False

    def succeeded(self, key: str) -> None:
        self.circuits.pop(key, None)

    def open(self) -> list[str]:
        return sorted(k for k, c in self.circuits.items() if c.opened_at is not None)

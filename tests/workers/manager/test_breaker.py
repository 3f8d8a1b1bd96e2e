"""The circuit breaker with a fake clock: open after repeated failures, one probe after the
cool-down, closed again by a success."""

from __future__ import annotations

from tests.workers.manager.test_pool import Clock
from workers.manager.breaker import Breakers


def test_repeated_failures_open_the_circuit_and_a_probe_closes_it() -> None:
    clock = Clock()
    breakers = Breakers(threshold=3, cooldown_s=10, clock=clock)
    for _ in range(2):
        assert breakers.allow("k")
        breakers.failed("k")
    assert breakers.allow("k")  # two failures: still closed
    breakers.failed("k")
    assert not breakers.allow("k") and breakers.open() == ["k"]
    clock.now = 9.9
    assert not breakers.allow("k")
    clock.now = 10
    assert breakers.allow("k")  # the probe
    assert not breakers.allow("k")  # only one at a time
    breakers.failed("k")  # the probe failed: open for another cool-down
    clock.now = 19.9
    assert not breakers.allow("k")
    clock.now = 20
    assert breakers.allow("k")
    breakers.succeeded("k")
    assert breakers.allow("k") and breakers.allow("k") and breakers.open() == []


def test_a_success_resets_the_count() -> None:
    breakers = Breakers(threshold=2, clock=Clock())
    breakers.failed("k")
    breakers.succeeded("k")
    breakers.failed("k")
    assert breakers.allow("k")
    assert breakers.allow("other")

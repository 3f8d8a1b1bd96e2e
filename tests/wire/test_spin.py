"""AdaptiveSpin: watch while answers have lately come within the limit, sleep at once otherwise."""

from __future__ import annotations

from wire.spin import AdaptiveSpin


def test_a_peer_that_answers_in_time_is_watched_for_the_limit() -> None:
    spin = AdaptiveSpin(limit_s=200e-6)
    for _ in range(50):
        spin.observe(50e-6)
    assert spin.budget() == 200e-6


def test_slow_answers_stop_the_watching_and_fast_ones_bring_it_back() -> None:
    spin = AdaptiveSpin(limit_s=200e-6)
    misses = 0
    while spin.budget() > 0:
        spin.observe(5e-3)
        misses += 1
    assert 10 <= misses <= 20  # a moving share: a few slow answers alone do not stop it
    for _ in range(100):  # a long slow spell: the share falls near zero
        spin.observe(5e-3)
    hits = 0
    while spin.budget() == 0:
        spin.observe(10e-6)
        hits += 1
    assert 10 <= hits <= 20


def test_a_zero_limit_never_watches() -> None:
    spin = AdaptiveSpin(limit_s=0.0)
    for _ in range(10):
        spin.observe(0.0)
    assert spin.budget() == 0.0

"""How long to watch shared memory for the other side before sleeping on a doorbell pipe.

Watching costs a core; sleeping costs a wake-up: 40-70 us from the pipe's write to the sleeper
running on a small VM (its idle virtual CPU must be scheduled again), more under load. Both ends
of the doorbell link watch for up to `limit_s` when most answers lately came within it, and sleep
at once otherwise: a distant peer gets no watcher, and an idle system has none. Whoever watches
yields the core on each look and stops watching as soon as a yield let another thread run (a
look took longer than `GAVE_WAY_S`): the core is wanted, so a loaded host gets no watchers.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")
GAVE_WAY_S = 50e-6  # a look (a check and a yield) alone on its core takes ~1-2 us


class AdaptiveSpin:
    def __init__(self, limit_s: float = 200e-6) -> None:
        self.limit_s = limit_s
        self.hit_rate = 1.0  # moving share of answers that came within limit_s

    def budget(self) -> float:
        """Seconds to watch before sleeping."""
        return self.limit_s if self.hit_rate > 0.5 and self.limit_s > 0 else 0.0

    def observe(self, seconds: float) -> None:
        self.hit_rate += 0.05 * ((seconds <= self.limit_s) - self.hit_rate)


def watch(look: Callable[[], T], budget_s: float,
          clock: Callable[[], float] = time.perf_counter) -> T | None:
    """`look()` until it returns something, for at most `budget_s`, yielding the core between
    looks; None when the budget ran out or a yield let another thread run (then sleep)."""
    now = clock()
    until = now + budget_s
    while True:
        found = look()
        if found:
            return found
        os.sched_yield()
        looked, now = now, clock()
        if now >= until or now - looked > GAVE_WAY_S:
            return None

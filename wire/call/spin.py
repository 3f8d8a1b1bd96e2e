"""How long to watch shared memory for the other side before sleeping on a doorbell pipe.

Watching costs a core; sleeping costs a wake-up: 40-70 us from the pipe's write to the sleeper
running on a small VM (its idle virtual CPU must be scheduled again), more under load. Both ends
of the doorbell link watch for up to `limit_s` when most answers lately came within it, and sleep
at once otherwise: a distant peer gets no watcher, and an idle system has none. Nobody watches
on a crowded host (more threads ready to run than CPUs, `crowded`): a watcher there would take
its fair share of a core from one that has work (crowded at two readings in a row: one thread
waking for a moment is no crowd). And whoever watches yields the core on each look and stops as
soon as a yield let another thread run for a time slice (a look took longer than `GAVE_WAY_S`).
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")
# A look (a check and a yield) alone on its core takes ~1-2 us; an interrupt or the hypervisor
# makes one take 50-70 us now and then (a 2-core Xeon VM: a greedy decode call's ~830 us watch
# was cut short in 4 of 10 calls at the 50 us this was, each cut costing a 40-70 us wake-up);
# another thread given the core by the yield keeps it for its slice, 0.75 ms or more.
GAVE_WAY_S = 300e-6
CROWD_EVERY = 32  # looks between two readings of the run queue (one costs ~2 us)


class AdaptiveSpin:
    def __init__(self, limit_s: float = 200e-6) -> None:
        self.limit_s = limit_s
        self.hit_rate = 1.0  # moving share of answers that came within limit_s

    def budget(self) -> float:
        """Seconds to watch before sleeping."""
        return self.limit_s if self.hit_rate > 0.5 and self.limit_s > 0 else 0.0

    def observe(self, seconds: float) -> None:
        self.hit_rate += 0.05 * ((seconds <= self.limit_s) - self.hit_rate)


class RunQueue:
    """Whether more threads are ready to run than there are CPUs, from /proc/loadavg's count of
    runnable threads (the reader included); never crowded where that file is missing."""

    def __init__(self, path: str = "/proc/loadavg") -> None:
        self.cpus = os.cpu_count() or 1
        try:
            self.fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            self.fd = -1

    def crowded(self) -> bool:
        if self.fd < 0:
            return False
        try:  # "0.52 0.31 0.20 3/118 4242": 3 runnable threads
            running = int(os.pread(self.fd, 64, 0).split(b" ")[3].split(b"/")[0])
        except (OSError, ValueError, IndexError):
            return False
        return running > self.cpus


@functools.cache
def _run_queue() -> RunQueue:
    return RunQueue()  # opened on first use, not when wire is imported


def crowded() -> bool:
    """Whether this host has more runnable threads than CPUs right now."""
    return _run_queue().crowded()


def watch(look: Callable[[], T], budget_s: float,
          clock: Callable[[], float] = time.perf_counter,
          busy: Callable[[], bool] = crowded) -> T | None:
    """`look()` until it returns something, for at most `budget_s`, yielding the core between
    looks; None when the budget ran out, the host is `busy` (checked after the first look, then
    every `CROWD_EVERY`, stopping at the second busy reading in a row) or a yield let another
    thread run for its slice: then sleep."""
    now = clock()
    until = now + budget_s
    looks, was_busy = 0, False
    while True:
        found = look()
        if found:
            return found
        if looks % CROWD_EVERY == 0:
            busy_now = busy()
            if busy_now and was_busy:
                return None
            was_busy = busy_now
        looks += 1
        os.sched_yield()
        looked, now = now, clock()
        if now >= until or now - looked > GAVE_WAY_S:
            return None

"""AdaptiveSpin: watch while answers have lately come within the limit, sleep at once otherwise;
`watch`: look until found, out of budget, or the core is wanted elsewhere."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from wire.call.spin import CROWD_EVERY, GAVE_WAY_S, AdaptiveSpin, RunQueue, watch


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


class Clock:
    """Time that moves `step_s` at each reading: looks of a known length."""

    def __init__(self, step_s: float) -> None:
        self.now, self.step_s = 0.0, step_s

    def __call__(self) -> float:
        self.now += self.step_s
        return self.now


def test_watch_returns_what_the_look_found() -> None:
    looks = iter([None, None, [3]])
    assert watch(lambda: next(looks), 1.0, Clock(1e-6), busy=lambda: False) == [3]


def test_watch_looks_until_the_budget_runs_out() -> None:
    step = 2.0 ** -20  # ~1 us, exact in binary: the sums are too
    looks = []
    assert watch(lambda: looks.append(1), 100 * step, Clock(step), busy=lambda: False) is None
    assert len(looks) == 100


def test_watch_stops_after_a_look_that_took_long() -> None:
    """A look much longer than a check and a yield: the yield ran another thread."""
    looks = []
    assert watch(lambda: looks.append(1), 1.0, Clock(2 * GAVE_WAY_S), busy=lambda: False) \
        is None
    assert len(looks) == 1


def test_watch_does_not_watch_on_a_crowded_host() -> None:
    """Crowded at two readings in a row: the watch stops at the second."""
    looks = []
    assert watch(lambda: looks.append(1), 1.0, Clock(1e-6), busy=lambda: True) is None
    assert len(looks) == CROWD_EVERY + 1


def test_one_crowded_reading_alone_does_not_stop_the_watch() -> None:
    """A thread that woke for a moment: the next reading finds the host as before."""
    readings = iter([False, True, False])
    looks = []
    found = watch(lambda: len(looks) == 3 * CROWD_EVERY or looks.append(1), 1.0, Clock(1e-6),
                  busy=lambda: next(readings, False))
    assert found is True
    assert len(looks) == 3 * CROWD_EVERY


def test_watch_goes_on_after_a_look_an_interrupt_made_long() -> None:
    """A look of 50-70 us (an interrupt, the hypervisor) is not another thread's time slice."""
    looks = []
    clock = Clock(1e-6)

    def look() -> None:
        looks.append(1)
        if len(looks) == 5:
            clock.now += 70e-6  # this look's yield came back late

    assert watch(look, 200 * 1e-6, clock, busy=lambda: False) is None
    assert len(looks) > 50  # it went on to the end of its budget


def test_run_queue_counts_runnable_threads_against_cpus(tmp_path) -> None:
    loadavg = tmp_path / "loadavg"
    loadavg.write_text("0.52 0.31 0.20 3/118 4242\n")
    queue = RunQueue(str(loadavg))
    queue.cpus = 2
    assert queue.crowded()
    queue.cpus = 3
    assert not queue.crowded()
    assert not RunQueue(str(tmp_path / "missing")).crowded()


def test_watch_gives_the_core_away_when_another_process_wants_it() -> None:
    """Sharing one CPU with a busy process, a watcher's yield lets it run: the watcher stops
    at once instead of spending its budget (2 s here) taking turns with it."""
    cpu = min(os.sched_getaffinity(0))
    affinity = os.sched_getaffinity(0)
    busy = subprocess.Popen([sys.executable, "-c", f"import os\nos.sched_setaffinity(0, {{{cpu}}})"
                             "\nprint('busy', flush=True)\nwhile True: pass"],
                            stdout=subprocess.PIPE, text=True)
    try:
        os.sched_setaffinity(0, {cpu})
        assert busy.stdout.readline() == "busy\n"  # it runs on that CPU from now on
        started = time.perf_counter()
        assert watch(lambda: None, budget_s=2.0) is None
        assert time.perf_counter() - started < 0.5
    finally:
        os.sched_setaffinity(0, affinity)
        busy.kill()
        busy.wait()

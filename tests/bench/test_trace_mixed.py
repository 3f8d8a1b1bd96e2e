"""bench.scenarios.trace_mixed: the jobs' training rate from their sampled step ends."""

from __future__ import annotations

import threading
import time

import pytest

from bench.scenarios.trace_mixed import StepClock


def clock_with(seen: dict[str, list[tuple[float, int]]]) -> StepClock:
    clock = StepClock(None, dict.fromkeys(seen, 0))
    clock.seen = seen
    return clock


def test_the_rate_counts_each_jobs_tokens_between_the_step_ends_around_the_window() -> None:
    clock = clock_with({"job-a": [(1.0, 100), (3.0, 300), (5.0, 500), (9.0, 700)],
                        "job-b": [(2.0, 50), (4.0, 250), (8.0, 650)]})
    # a: 100 -> 700 tokens from t=1 to 9 (75/s); b: 50 -> 650 from 2 to 8 (100/s)
    assert clock.rate(2.5, 8.5) == pytest.approx(175.0)
    # a: 300 -> 500 from 3 to 5 (100/s); b: 50 -> 650 from 2 to 8 (100/s)
    assert clock.rate(3.0, 5.0) == pytest.approx(200.0)
    # a window inside one slow step of a still has a rate: a 500 -> 700 from 5 to 9 (50/s),
    # b 250 -> 650 from 4 to 8 (100/s)
    assert clock.rate(5.5, 7.5) == pytest.approx(150.0)
    # before a job's first step end and after its last, its own first and last count
    assert clock.rate(0.0, 10.0) == pytest.approx(175.0)


def test_a_job_with_one_step_end_has_no_rate() -> None:
    clock = clock_with({"job-a": [(1.0, 100)], "job-b": [(2.0, 50), (4.0, 250)]})
    with pytest.raises(RuntimeError, match="fewer than two steps"):
        clock.rate(0.0, 5.0)


def test_waiting_past_a_moment_returns_once_every_job_has_a_later_step_end() -> None:
    clock = clock_with({"job-a": [(1.0, 100)], "job-b": [(2.0, 50)]})
    moment = time.monotonic()
    late = threading.Timer(0.3, lambda: [clock.seen[job].append((time.monotonic(), 900))
                                         for job in clock.seen])
    late.start()
    clock.wait_past(moment, timeout=10)
    assert min(marks[-1][0] for marks in clock.seen.values()) > moment
    with pytest.raises(RuntimeError, match="no step after"):
        clock.wait_past(time.monotonic() + 1.0, timeout=0.3)

"""bench.scenarios.trace_mixed: the jobs' training rate from their sampled step ends."""

from __future__ import annotations

import pytest

from bench.scenarios.trace_mixed import StepClock


def test_the_rate_counts_each_jobs_tokens_between_its_first_and_last_step_in_the_window() -> None:
    clock = StepClock(None, {"job-a": 0, "job-b": 1})
    clock.seen = {"job-a": [(1.0, 100), (3.0, 300), (5.0, 500), (9.0, 900)],
                  "job-b": [(2.0, 50), (4.0, 250), (8.0, 650)]}
    # a: 300 -> 500 tokens from t=3 to 5 (100/s); b: 250 -> 650 from 4 to 8 (100/s)
    assert clock.rate(2.5, 8.5) == pytest.approx(200.0)
    # from t=1: a's 100 -> 500 over 4 s and b's 50 -> 650 over 6 s
    assert clock.rate(0.0, 8.5) == pytest.approx(100.0 + 100.0)
    with pytest.raises(RuntimeError, match="fewer than two steps"):
        clock.rate(4.5, 8.5)  # a has one step end in it


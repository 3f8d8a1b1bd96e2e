"""A trainer's step runs on its share of the cores, but on no more threads than its tokens keep
busy (`TOKENS_PER_THREAD` each)."""

from __future__ import annotations

from workers.training.threads import step_threads


def test_a_step_takes_a_thread_per_tokens_per_thread_up_to_its_share() -> None:
    assert [step_threads(2, t) for t in (0, 32, 64, 128, 255, 256, 4096)] == [1, 1, 1, 1, 1, 2, 2]
    assert [step_threads(16, t) for t in (32, 256, 1000, 2048, 4096)] == [1, 2, 7, 16, 16]
    assert step_threads(1, 4096) == 1

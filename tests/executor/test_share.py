"""Training's share of batches: counted only while training has work, over a sliding window."""

from __future__ import annotations

import pytest

from executor.share import TrainingShare


def test_batches_count_against_training_only_while_it_has_work() -> None:
    share = TrainingShare(0.25, window=8)
    share.record(False)  # nothing of training's queued: counts for neither side
    assert share.of_recent() == 0.0 and not share.kept()
    share.queued = 1
    share.record(False)
    share.record(True)
    assert share.of_recent() == 0.5 and share.kept()
    share.queued = 0
    for _ in range(5):
        share.record(False)  # its trainers compute their own part meanwhile
    assert share.of_recent() == 0.5
    share.record(False, has_work=True)  # between the slices of a training batch
    assert share.of_recent() == pytest.approx(1 / 3)
    share.record(False, has_work=True)
    share.record(False, has_work=True)
    assert share.of_recent() == pytest.approx(1 / 5) and not share.kept()
    for _ in range(7):
        share.record(True)  # the window holds the last 8: the oldest fall out
    assert share.of_recent() == pytest.approx(7 / 8)

"""Training's share of the executor's compute time: counted only while training has work, over
a sliding window of batches, each weighed by its compute seconds (a training batch run in short
slices is not worth more than the decode batches between them)."""

from __future__ import annotations

import os
import time

import pytest

from executor.share import TWIN_HOLD_S, TrainingShare
from executor.twin_ledger import TwinLedger


def test_batches_count_against_training_only_while_it_has_work() -> None:
    share = TrainingShare(0.25, window=8)
    share.record(False, 0.004)  # nothing of training's queued: counts for neither side
    assert share.of_recent() == 0.0 and not share.kept()
    share.queued = 1
    share.record(False, 0.004)
    share.record(True, 0.004)
    assert share.of_recent() == 0.5 and share.kept()
    share.queued = 0
    for _ in range(5):
        share.record(False, 0.004)  # its trainers compute their own part meanwhile
    assert share.of_recent() == 0.5
    share.running = True  # between the slices of a training batch
    share.record(False, 0.004)
    assert share.of_recent() == pytest.approx(1 / 3)
    share.record(False, 0.004)
    share.record(False, 0.004)
    assert share.of_recent() == pytest.approx(1 / 5) and not share.kept()
    for _ in range(7):
        share.record(True, 0.004)  # the window holds the last 8: the oldest fall out
    assert share.of_recent() == pytest.approx(7 / 8)


def test_a_batch_weighs_its_compute_time_not_one() -> None:
    share = TrainingShare(0.25, window=64)
    share.queued = 1
    for _ in range(10):  # ten 0.5 ms slices beside ten 4 ms decode batches: 11 %, not a half
        share.record(True, 0.0005)
        share.record(False, 0.004)
    assert share.of_recent() == pytest.approx(0.005 / 0.045) and not share.kept()
    share.record(True, 0.010)
    assert share.of_recent() == pytest.approx(0.015 / 0.055) and share.kept()


def test_a_sliced_batch_counts_each_slice_and_then_only_its_rest() -> None:
    share = TrainingShare(0.25, window=64)
    share.start(training=True)
    share.sliced(1.0)
    share.ran(training=False, seconds=2.0)  # a decode batch between slices counts: it has work
    share.sliced(1.0)
    share.ran(training=True, seconds=3.0)  # the batch's 3 s in all: 1 s after its slices
    assert share.of_recent() == pytest.approx(3 / 5) and not share.running
    share.ran(training=False, seconds=2.0)  # nothing of training's queued or running now
    assert share.of_recent() == pytest.approx(3 / 5)
    share.start(training=False)
    share.queued = 1
    share.ran(training=False, seconds=5.0)
    assert share.of_recent() == pytest.approx(3 / 10) and share.kept()


def test_the_idle_twin_tells_its_work_and_seconds_across_the_fork() -> None:
    """The twin's share tells its calls queued or running and its training seconds through the
    page both processes map (`TwinLedger`, before the fork): of a batch's seconds, those it had
    the host for (its CPU time over its threads: at nice 19 others' compute stretches its
    batches). The serving executor's share counts them as training's, and its own batches
    while the twin has work."""
    ledger = TwinLedger()
    pid = os.fork()
    if pid == 0:  # the twin, 2 threads: three calls queued, two taken and run for 2 s each
        cpu = iter([0.0, 4.0, 4.0, 6.0])  # the first on the host, the second half the time
        twin = TrainingShare(0.25, tell=ledger, threads=2, cpu=lambda: next(cpu))
        twin.queued = 3
        for _ in range(2):
            twin.queued -= 1
            twin.start(training=True)
            twin.ran(training=True, seconds=2.0)
        os._exit(0)
    assert os.waitpid(pid, 0)[1] == 0
    assert (ledger.calls, ledger.seconds) == (1, 3.0)  # 2 s, and 1 s of the other 2
    serving = TrainingShare(0.25, twin=ledger)
    serving.record(False, 1.0)  # the twin has work: this batch counts against it
    assert serving.of_recent() == pytest.approx(0.75) and not serving.owed()
    for _ in range(8):
        serving.record(False, 1.0)
    assert serving.of_recent() == 0.25 and not serving.owed()  # 3 s of 12: its floor
    serving.record(False, 1.0)
    assert serving.owed()
    ledger.working(0)  # the twin has nothing left: no longer owed, and batches count no more
    serving.record(False, 1.0)
    assert not serving.owed() and serving.of_recent() == pytest.approx(3 / 13)


def test_the_serving_executor_holds_the_twins_training_across_the_fork() -> None:
    """Each inference batch tells the twin, through the shared page, until when its training
    leaves the host: `TWIN_HOLD_S` on while training keeps twice its floor, less as it nears
    the floor; owed its floor, training is held no longer."""
    ledger = TwinLedger()
    pid = os.fork()
    if pid == 0:  # the twin: waits to be held (written after the fork), then says until when
        twin, deadline = TrainingShare(0.25, tell=ledger), time.monotonic() + 10
        while twin.held(100.0) == 0.0 and time.monotonic() < deadline:
            time.sleep(0.001)
        os._exit(round(twin.held(100.0) * 1000))
    serving = TrainingShare(0.25, twin=ledger)
    ledger.computed(1.0)  # the twin's compute so far: all the executors' time, training's
    serving.inference_started(100.0)
    assert os.waitpid(pid, 0)[1] >> 8 == round(TWIN_HOLD_S * 1000)
    ledger.working(1)
    serving.record(False, 1.0)  # half the time training's: twice its floor, held the longest
    serving.inference_started(100.5)
    assert ledger.held_until == pytest.approx(100.5 + TWIN_HOLD_S)
    serving.record(False, 1.0)  # a third: held less
    serving.inference_started(101.0)
    assert ledger.held_until == pytest.approx(101.0 + TWIN_HOLD_S / 3)
    serving.record(False, 2.0)  # below its floor: owed, held no longer
    assert serving.owed() and ledger.held_until == 0.0
    assert serving.now() == (0.2, 0.25, 0.0, 0)
    serving.inference_started(102.0)
    assert ledger.held_until == 0.0 and serving.now().twin_owed == 1

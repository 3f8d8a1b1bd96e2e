"""Workers step down below the executor, trainers further as batch work (checked in forked
children: it changes the process)."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

import pytest

from workers.priority import TRAINER_NICE, WORKER_NICE, below_executor, yield_to_inference


def _in_a_child(step_down: Callable[[], None]) -> tuple[int, int]:
    """(scheduling policy, nice) of a forked child after `step_down` twice."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        step_down()
        step_down()  # twice changes nothing more
        os.write(write, f"{os.sched_getscheduler(0)} {os.nice(0)}".encode())
        os._exit(0)
    os.waitpid(pid, 0)
    policy, nice = map(int, os.read(read, 64).split())
    return policy, nice


@pytest.mark.skipif(sys.platform != "linux", reason="SCHED_BATCH is Linux's")
def test_a_trainer_is_batch_work_below_the_inference_workers() -> None:
    assert _in_a_child(yield_to_inference) == (os.SCHED_BATCH, max(TRAINER_NICE, os.nice(0)))
    assert _in_a_child(below_executor) == (os.SCHED_OTHER, max(WORKER_NICE, os.nice(0)))
    assert 0 < WORKER_NICE < TRAINER_NICE  # the executor, which stays at its start, first

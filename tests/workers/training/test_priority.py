"""Trainers run as low-priority batch work (checked in a forked child: it changes the process)."""

from __future__ import annotations

import os
import sys

import pytest

from workers.training.priority import TRAINER_NICE, yield_to_inference


@pytest.mark.skipif(sys.platform != "linux", reason="SCHED_BATCH is Linux's")
def test_a_trainer_is_batch_work_at_a_lower_priority() -> None:
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        yield_to_inference()
        yield_to_inference()  # twice changes nothing more
        os.write(write, f"{os.sched_getscheduler(0)} {os.nice(0)}".encode())
        os._exit(0)
    os.waitpid(pid, 0)
    policy, nice = map(int, os.read(read, 64).split())
    assert policy == os.SCHED_BATCH
    assert nice == max(TRAINER_NICE, os.nice(0))

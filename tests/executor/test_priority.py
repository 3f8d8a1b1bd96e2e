"""An executor for fine-tuning jobs runs at the lowest priority, every thread of it: those it had
and those it starts after (checked in a forked child: it changes the process for good)."""

from __future__ import annotations

import json
import os
import sys
import threading

import pytest

from executor.__main__ import parse_args
from executor.priority import NICE, lowest_priority
from tests.helpers import priorities


def _priority_of_a_new_thread() -> list[int]:
    seen: list[list[int]] = []
    thread = threading.Thread(target=lambda: seen.append(
        [os.sched_getscheduler(0), os.getpriority(os.PRIO_PROCESS, threading.get_native_id())]))
    thread.start()
    thread.join()
    return seen[0]


@pytest.mark.skipif(sys.platform != "linux", reason="per-thread priorities are Linux's")
def test_every_thread_of_a_jobs_executor_runs_at_the_lowest_priority() -> None:
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            started, stop = threading.Event(), threading.Event()
            earlier = threading.Thread(target=lambda: (started.set(), stop.wait()))
            earlier.start()
            started.wait()
            done = lowest_priority()
            threads = sorted(priorities(os.getpid()))
            count = len(os.listdir("/proc/self/task"))
            stop.set()
            os.write(write, json.dumps([done, count, threads,
                                        _priority_of_a_new_thread()]).encode())
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    done, count, threads, later = json.loads(os.read(read, 256))
    assert done and count == 2
    assert threads == [[os.SCHED_BATCH, NICE]] and later == [os.SCHED_BATCH, NICE]
    assert (os.SCHED_BATCH, NICE) not in priorities(os.getpid())  # this process untouched


def test_idle_is_a_flag_of_the_executor_and_off_by_default() -> None:
    assert parse_args(["--idle"]).idle and not parse_args([]).idle

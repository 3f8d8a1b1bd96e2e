"""An executor for fine-tuning jobs runs at idle priority, every thread of it: those it had and
those it starts after (checked in a forked child: it changes the process for good)."""

from __future__ import annotations

import json
import os
import sys
import threading

import pytest

from executor.__main__ import parse_args
from executor.priority import run_idle


def _policy_of_a_new_thread() -> int:
    seen: list[int] = []
    thread = threading.Thread(target=lambda: seen.append(os.sched_getscheduler(0)))
    thread.start()
    thread.join()
    return seen[0]


@pytest.mark.skipif(sys.platform != "linux", reason="SCHED_IDLE is Linux's")
def test_every_thread_of_an_idle_executor_runs_at_idle_priority() -> None:
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            started, stop = threading.Event(), threading.Event()
            earlier = threading.Thread(target=lambda: (started.set(), stop.wait()))
            earlier.start()
            started.wait()
            done = run_idle()
            tids = [int(t) for t in os.listdir("/proc/self/task")]
            policies = {os.sched_getscheduler(t) for t in tids}
            stop.set()
            os.write(write, json.dumps([done, len(tids), sorted(policies),
                                        _policy_of_a_new_thread()]).encode())
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    done, threads, policies, later = json.loads(os.read(read, 256))
    assert done and threads == 2
    assert policies == [os.SCHED_IDLE] and later == os.SCHED_IDLE
    assert os.sched_getscheduler(0) != os.SCHED_IDLE  # this process untouched


def test_idle_is_a_flag_of_the_executor_and_off_by_default() -> None:
    assert parse_args(["--idle"]).idle and not parse_args([]).idle

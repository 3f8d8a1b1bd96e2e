"""Trainers' torch threads: the cores shared out among the jobs running at once, told to running
trainers as jobs start and end (a trainer that has not said hello yet is told when it does)."""

from __future__ import annotations

import logging

from tests.workers.manager.job_scheduling import create, running_job, scheduler_with
from wire.jobs import TrainerThreads
from workers.manager.capacity import ThreadShare


def test_a_share_is_the_cores_over_the_running_jobs_or_an_operators_count() -> None:
    assert [ThreadShare(cores=2).of(n) for n in (0, 1, 2, 3, 8)] == [2, 2, 1, 1, 1]
    assert [ThreadShare(cores=16).of(n) for n in (1, 2, 3, 5, 8)] == [16, 8, 5, 3, 2]
    assert [ThreadShare(cores=16, fixed=3).of(n) for n in (1, 2, 8)] == [3, 3, 3]
    assert ThreadShare(cores=1).of(4) == 1  # the scheduler's default: one thread each


def test_running_trainers_share_the_cores_as_jobs_start_and_end(tmp_path, caplog) -> None:
    caplog.set_level(logging.INFO, logger="workers.jobs")
    store, scheduler, seen = scheduler_with(tmp_path, max_jobs=3, threads=ThreadShare(cores=4))
    first = running_job(scheduler, 101)
    assert seen.spawned_on == {first: 4} and seen.threads == []  # alone: every core
    second = create(scheduler)  # spawned, not yet said hello
    assert seen.spawned_on[second] == 2 and seen.threads == [TrainerThreads(first, 2)]
    third = create(scheduler)
    assert seen.spawned_on[third] == 1
    assert seen.threads[1:] == [TrainerThreads(first, 1)]  # the second hears it at its hello
    for pid, job in ((102, second), (103, third)):
        scheduler.spawned(job, pid)
        scheduler.hello(job)
    assert seen.threads[2:] == [TrainerThreads(second, 1)]  # the third's spec said 1 already
    store.move(first, "succeeded")
    assert scheduler.exited(101, 0)
    assert seen.threads[3:] == [TrainerThreads(second, 2), TrainerThreads(third, 2)]
    store.move(second, "succeeded")
    assert scheduler.exited(102, 0)
    assert seen.threads[5:] == [TrainerThreads(third, 4)]
    assert seen.started == [first, second, third]
    assert [r.getMessage() for r in caplog.records if "each trainer" in r.getMessage()] == [
        f"{n} job(s) running: each trainer on {t} threads" for n, t in
        ((1, 4), (2, 2), (3, 1), (2, 2), (1, 4))]


def test_a_queued_job_that_starts_as_one_ends_keeps_the_running_ones_share(tmp_path) -> None:
    store, scheduler, seen = scheduler_with(tmp_path, max_jobs=2, threads=ThreadShare(cores=4))
    first, second = running_job(scheduler, 101), running_job(scheduler, 102)
    queued = create(scheduler)
    assert seen.spawned_on == {first: 4, second: 2}
    assert seen.threads == [TrainerThreads(first, 2)]
    store.move(first, "succeeded")
    assert scheduler.exited(101, 0)
    assert seen.spawned_on[queued] == 2 and seen.threads == [TrainerThreads(first, 2)]


def test_an_operators_count_is_never_told_anew(tmp_path) -> None:
    store, scheduler, seen = scheduler_with(tmp_path, max_jobs=3,
                                            threads=ThreadShare(cores=4, fixed=2))
    jobs = [running_job(scheduler, pid) for pid in (101, 102, 103)]
    store.move(jobs[0], "succeeded")
    assert scheduler.exited(101, 0)
    assert seen.spawned_on == dict.fromkeys(jobs, 2) and seen.threads == []


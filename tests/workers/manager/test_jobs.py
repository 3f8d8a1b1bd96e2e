"""The manager's fine-tuning queue, driven by events, with a real job store and recorded
messages in place of sockets and the spawner."""

from __future__ import annotations

import pytest

from state.db import Database
from state.files import FileStore
from state.job_spec import JobSpec, PeftSpec
from state.jobs import JobStore
from wire.jobs import (
    JobAction,
    JobCommand,
    JobState,
    JobStatus,
    TrainerAck,
    TrainerControl,
    TrainerStopped,
)
from workers.manager.job_ledger import JobLedger
from workers.manager.jobs import JobScheduler
from workers.manager.specs import trainer_job


class Recorder:
    def __init__(self) -> None:
        self.started: list[str] = []
        self.answers: list[tuple[bytes, JobState]] = []
        self.controls: list[tuple[str, TrainerControl]] = []
        self.acks: list[str] = []

    def to_trainer(self, job_id: str, message) -> None:
        if isinstance(message, TrainerAck):
            self.acks.append(job_id)
        else:
            self.controls.append((job_id, message))


def scheduler_with(tmp_path, max_jobs: int) -> tuple[JobStore, JobScheduler, Recorder]:
    db = Database(tmp_path / "state.db")
    store, files = JobStore(db), FileStore(db, tmp_path)
    seen = Recorder()
    scheduler = JobScheduler(
        JobLedger(store, files, tmp_path), lambda spec: seen.started.append(spec.id),
        lambda job: trainer_job(job, files),  # the spec's job is all these tests look at
        lambda gateway, state: seen.answers.append((gateway, state)),
        seen.to_trainer, max_jobs=max_jobs)
    return store, scheduler, seen


@pytest.fixture()
def setup(tmp_path):
    return scheduler_with(tmp_path, max_jobs=1)


def queued_job(store: JobStore, tenant: str = "acme", priority: int = 0) -> str:
    job = store.create(tenant, "m", "file", None, None, 1, JobSpec(1, 1, 1.0, PeftSpec()), None,
                       priority)
    store.move(job.id, "queued")
    return job.id


def running_job(store: JobStore, scheduler, pid: int) -> str:
    """A job scheduled into a free slot whose trainer (process `pid`) has said hello."""
    job = queued_job(store)
    scheduler.schedule()
    scheduler.spawned(job, pid)
    scheduler.hello(job)
    return job


def test_a_queued_job_starts_on_its_message_and_the_next_when_a_slot_frees(setup) -> None:
    store, scheduler, seen = setup
    first, second = queued_job(store), queued_job(store)
    scheduler.command(b"gw", JobCommand("r1", first, JobAction.START))
    assert seen.started == [first]  # one slot
    assert seen.answers[-1][1].status in ("running", "queued")
    scheduler.spawned(first, 101)
    store.move(first, "succeeded")
    assert scheduler.exited(101, 0)
    assert seen.started == [first, second]
    assert not scheduler.exited(999, 0)  # not a trainer of ours


def test_pause_goes_to_the_trainer_and_answers_when_it_stopped(setup) -> None:
    store, scheduler, seen = setup
    job = queued_job(store)
    scheduler.schedule()
    scheduler.spawned(job, 7)
    scheduler.command(b"gw", JobCommand("p1", job, JobAction.PAUSE))
    assert seen.controls == []  # not connected yet: held until hello
    scheduler.hello(job)
    assert seen.controls == [(job, TrainerControl(job, JobAction.PAUSE))]
    assert seen.answers == []  # no answer before the trainer acted
    scheduler.report(TrainerStopped(job, JobStatus.PAUSED, "Job paused at step 3"))
    assert seen.answers == [(b"gw", JobState("p1", job, "paused"))]
    assert seen.acks == [job]  # the trainer may exit: its last report is recorded
    assert store.events(job, after=None, limit=1)[0][0]["message"] == "Job paused at step 3"
    assert scheduler.exited(7, 0) and store.get(job).status == "paused"


def test_a_trainer_dying_before_a_cancel_still_cancels_and_crashes_requeue(setup) -> None:
    store, scheduler, seen = setup
    job = running_job(store, scheduler, 8)
    scheduler.command(b"gw", JobCommand("c1", job, JobAction.CANCEL))
    scheduler.exited(8, -9)
    assert store.get(job).status == "cancelled"
    assert seen.answers == [(b"gw", JobState("c1", job, "cancelled"))]
    other = queued_job(store)
    scheduler.schedule()
    scheduler.spawned(other, 9)
    scheduler.exited(9, -9)  # a crash, nothing asked: back to the queue, and started again
    assert seen.started[-1] == other and store.get(other).status == "running"


def test_recovery_requeues_jobs_a_previous_stack_left_running(setup) -> None:
    store, scheduler, seen = setup
    job = queued_job(store)
    store.claim(1)
    scheduler.recover()
    assert seen.started == [job] and store.get(job).attempts == 2
    assert "restarted" in store.events(job, after=None, limit=5)[0][0]["message"]


def test_a_higher_priority_job_preempts_the_lowest_running_one(tmp_path) -> None:
    store, scheduler, seen = scheduler_with(tmp_path, max_jobs=2)

    def job(priority: int) -> str:
        return queued_job(store, priority=priority)

    low, middle = job(0), job(5)
    scheduler.schedule()
    for pid, job_id in enumerate((low, middle), start=10):
        scheduler.spawned(job_id, pid)
        scheduler.hello(job_id)
    same = job(0)
    scheduler.command(b"gw", JobCommand("s1", same, JobAction.START))
    assert seen.controls == []  # no running job has a lower priority: it waits its turn
    urgent = job(9)
    scheduler.command(b"gw", JobCommand("s2", urgent, JobAction.START))
    assert seen.controls == [(low, TrainerControl(low, JobAction.PREEMPT))]
    scheduler.command(b"gw", JobCommand("s3", urgent, JobAction.START))
    assert len(seen.controls) == 1  # one preemption at a time
    scheduler.report(TrainerStopped(low, JobStatus.QUEUED, "Preempted"))  # checkpoint saved
    assert scheduler.exited(10, 0)
    assert set(seen.started[:2]) == {low, middle}
    assert seen.started[2:] == [urgent]  # the urgent job takes the slot, not low again
    assert store.get(low).status == "queued" and store.get(same).status == "queued"


def test_a_preempted_trainer_that_dies_is_requeued_not_failed(setup) -> None:
    store, scheduler, seen = setup
    low = running_job(store, scheduler, 21)
    urgent = queued_job(store, priority=3)
    scheduler.schedule()
    assert seen.controls[-1][1].action == JobAction.PREEMPT
    assert scheduler.exited(21, -9)
    assert store.get(low).status == "queued"
    assert seen.started == [low, urgent]


def test_a_report_the_database_cannot_take_is_not_acknowledged_and_the_manager_goes_on(
        setup) -> None:
    store, scheduler, seen = setup
    job = running_job(store, scheduler, 31)
    store.db.conn.close()  # every write now fails as a broken database does
    scheduler.report(TrainerStopped(job, JobStatus.PAUSED, "Job paused at step 1"))
    assert seen.acks == [] and seen.answers == []  # its trainer will exit for a retry

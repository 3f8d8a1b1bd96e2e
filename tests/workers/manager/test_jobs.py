"""The manager's fine-tuning queue, driven by events, with a real job store and recorded
messages in place of sockets and the spawner."""

from __future__ import annotations

import pytest

from state.jobs import new_id
from tests.workers.manager.job_scheduling import create, new_job, running_job, scheduler_with
from wire.jobs import (
    JobAction,
    JobCommand,
    JobState,
    JobStatus,
    TrainerControl,
    TrainerStopped,
)
from workers.manager.capacity import JobBudget, model_shape


@pytest.fixture()
def setup(tmp_path):
    return scheduler_with(tmp_path, max_jobs=1)


def test_a_created_job_starts_at_once_and_the_next_when_a_slot_frees(setup) -> None:
    store, scheduler, seen = setup
    first, second = create(scheduler), create(scheduler)
    assert seen.started == [first]  # one slot
    assert [a.status for _, a in seen.answers] == ["running", "queued"]
    assert all(a.moved for _, a in seen.answers)
    assert [e["message"] for e in store.events(second, after=None, limit=5)[0]] == [
        "Files validated, moving job to queued state", "Validating training file: file"]
    scheduler.spawned(first, 101)
    store.move(first, "succeeded")
    assert scheduler.exited(101, 0)
    assert seen.started == [first, second]
    assert not scheduler.exited(999, 0)  # not a trainer of ours


def test_pause_goes_to_the_trainer_and_answers_when_it_stopped(setup) -> None:
    store, scheduler, seen = setup
    job = create(scheduler)
    seen.answers.clear()
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
    job = running_job(scheduler, 8)
    seen.answers.clear()
    scheduler.command(b"gw", JobCommand("c1", job, JobAction.CANCEL))
    scheduler.exited(8, -9)
    assert store.get(job).status == "cancelled"
    assert seen.answers == [(b"gw", JobState("c1", job, "cancelled"))]
    other = create(scheduler)
    scheduler.spawned(other, 9)
    scheduler.exited(9, -9)  # a crash, nothing asked: back to the queue, and started again
    assert seen.started[-1] == other and store.get(other).status == "running"


def test_recovery_requeues_jobs_a_previous_stack_left_running(setup) -> None:
    store, scheduler, seen = setup
    job = scheduler.ledger.create(new_id("ftjob"), new_job()).id
    store.claim(1)
    scheduler.recover()
    assert seen.started == [job] and store.get(job).attempts == 2
    assert "restarted" in store.events(job, after=None, limit=5)[0][0]["message"]


def test_a_higher_priority_job_preempts_the_lowest_running_one(tmp_path) -> None:
    store, scheduler, seen = scheduler_with(tmp_path, max_jobs=2)

    def job(priority: int) -> str:
        return create(scheduler, priority=priority)

    low, middle = job(0), job(5)
    for pid, job_id in enumerate((low, middle), start=10):
        scheduler.spawned(job_id, pid)
        scheduler.hello(job_id)
    same = job(0)
    assert seen.controls == []  # no running job has a lower priority: it waits its turn
    urgent = job(9)
    assert seen.controls == [(low, TrainerControl(low, JobAction.PREEMPT))]
    scheduler.schedule()
    assert len(seen.controls) == 1  # one preemption at a time
    scheduler.report(TrainerStopped(low, JobStatus.QUEUED, "Preempted"))  # checkpoint saved
    assert scheduler.exited(10, 0)
    assert set(seen.started[:2]) == {low, middle}
    assert seen.started[2:] == [urgent]  # the urgent job takes the slot, not low again
    assert store.get(low).status == "queued" and store.get(same).status == "queued"


def test_a_preempted_trainer_that_dies_is_requeued_not_failed(setup) -> None:
    store, scheduler, seen = setup
    low = running_job(scheduler, 21)
    urgent = create(scheduler, priority=3)
    assert seen.controls[-1][1].action == JobAction.PREEMPT
    assert scheduler.exited(21, -9)
    assert store.get(low).status == "queued"
    assert seen.started == [low, urgent]


def test_a_report_the_database_cannot_take_is_not_acknowledged_and_the_manager_goes_on(
        setup) -> None:
    store, scheduler, seen = setup
    job = running_job(scheduler, 31)
    seen.answers.clear()
    store.db.conn.close()  # every write now fails as a broken database does
    scheduler.report(TrainerStopped(job, JobStatus.PAUSED, "Job paused at step 1"))
    assert seen.acks == [] and seen.answers == []  # its trainer will exit for a retry


def test_jobs_no_trainer_runs_move_at_once_and_a_refused_move_says_so(setup) -> None:
    store, scheduler, seen = setup
    running_job(scheduler, 41)  # the one slot is taken: the next job waits
    waiting = create(scheduler)
    scheduler.command(b"gw", JobCommand("p", waiting, JobAction.PAUSE))
    assert seen.answers[-1] == (b"gw", JobState("p", waiting, JobStatus.PAUSED, True))
    assert seen.controls == []  # no trainer was asked anything
    scheduler.command(b"gw", JobCommand("p2", waiting, JobAction.PAUSE))
    assert seen.answers[-1] == (b"gw", JobState("p2", waiting, JobStatus.PAUSED, False))
    store.update(waiting, attempts=2)
    scheduler.command(b"gw", JobCommand("r", waiting, JobAction.RESUME))
    assert seen.answers[-1] == (b"gw", JobState("r", waiting, JobStatus.QUEUED, True))
    assert store.get(waiting).attempts == 0  # a resumed job has its retries again
    scheduler.command(b"gw", JobCommand("r2", waiting, JobAction.RESUME))
    assert seen.answers[-1][1].moved is False
    scheduler.command(b"gw", JobCommand("c", waiting, JobAction.CANCEL))
    assert seen.answers[-1] == (b"gw", JobState("c", waiting, JobStatus.CANCELLED, True))
    assert [e["message"] for e in store.events(waiting, after=None, limit=3)[0]] == [
        "Job cancelled", "Job resumed; queued to continue from its latest checkpoint",
        "Job paused"]
    scheduler.command(b"gw", JobCommand("x", "ftjob-nonesuch", JobAction.CANCEL))
    assert seen.answers[-1] == (b"gw", JobState("x", "ftjob-nonesuch", JobStatus.UNKNOWN, False))


def test_a_job_whose_file_cannot_train_fails_at_once_and_a_repeated_create_finds_it(
        setup) -> None:
    store, scheduler, seen = setup
    command = JobCommand("n", new_id("ftjob"), JobAction.CREATE,
                         new_job(problem="Training file has 3 example(s), but must have at "
                                 "least 10"))
    scheduler.command(b"gw", command)
    scheduler.command(b"gw", command)  # the gateway's retry of the same command
    assert [a.status for _, a in seen.answers] == ["failed", "failed"]
    assert seen.started == [] and len(store.with_status("failed")) == 1
    job = store.get(command.job_id)
    assert job.error == {"code": "invalid_n_examples", "param": "training_file",
                         "message": "Training file has 3 example(s), but must have at least 10"}


def test_a_command_the_database_cannot_take_is_answered_and_the_manager_goes_on(setup) -> None:
    store, scheduler, seen = setup
    store.db.conn.close()
    job_id = create(scheduler)
    assert seen.answers == [(b"gw", JobState(f"new-{job_id}", job_id, JobStatus.UNKNOWN,
                                             False))]


def test_a_resume_before_the_paused_trainer_exited_waits_for_its_exit(setup) -> None:
    """Its checkpoint is whole only once it exited: no second trainer before that."""
    store, scheduler, seen = setup
    job = running_job(scheduler, 51)
    scheduler.command(b"gw", JobCommand("p", job, JobAction.PAUSE))
    scheduler.report(TrainerStopped(job, JobStatus.PAUSED, "Job paused at step 2"))
    seen.answers.clear()
    scheduler.command(b"gw", JobCommand("r", job, JobAction.RESUME))
    assert seen.answers == [] and seen.started == [job]  # not while it still runs
    assert scheduler.exited(51, 0)
    assert seen.answers == [(b"gw", JobState("r", job, JobStatus.RUNNING, True))]
    assert seen.started == [job, job] and store.get(job).attempts == 1


def test_jobs_start_while_their_memory_fits_and_recomputing_ones_fit_more(tmp_path) -> None:
    """A budget of two default jobs of the 1B model (the count allows eight): two run and a
    third waits for memory; a job recomputing its layers takes about a third as much, so seven
    fit where two did; the queue keeps its order (none overtakes a job that waits)."""
    shape = model_shape("llama-1b")
    budget = JobBudget(int(2.5 * JobBudget(0, shape).cost(False)), shape)
    assert budget.bytes // budget.cost(False) == 2 and budget.bytes // budget.cost(True) == 7
    store, scheduler, seen = scheduler_with(tmp_path, max_jobs=8, budget=budget)
    first, second, third = (create(scheduler) for _ in range(3))
    light = create(scheduler, recompute=True)
    assert seen.started == [first, second]  # the third waits for memory, the light one too
    assert store.get(third).status == "queued" and store.get(light).status == "queued"
    scheduler.schedule()  # again: the third is told once
    waiting = [e["message"] for e in store.events(third, after=None, limit=10)[0]
               if e["message"].startswith("Waiting for memory")]
    assert waiting == ["Waiting for memory: running jobs may take 23.3 GiB of the 29.1 GiB for "
                       "jobs, and this one up to 11.6 GiB"]
    for pid, job in ((11, first), (12, second)):
        scheduler.spawned(job, pid)
        store.move(job, "succeeded")
        assert scheduler.exited(pid, 0)
    assert seen.started[2:] == [third, light]  # room for both now
    more = [create(scheduler, recompute=True) for _ in range(6)]
    assert seen.started[4:] == more[:3]  # beside a default job and a light one: three more
    scheduler.spawned(third, 13)
    store.move(third, "succeeded")
    assert scheduler.exited(13, 0)
    assert seen.started[7:] == more[3:]  # light jobs only: seven at once
    assert scheduler.running == 7


def test_with_the_executors_head_loss_more_jobs_fit_unless_they_adapt_the_head(
        tmp_path) -> None:
    """The same budget of 2.5 default jobs of the 1B model: while the executor offers the head's
    loss, a job keeps no logits (9.4 GiB, not 11.6) and three run where two did; a job whose
    LoRA adapts the head computes its logits itself and is counted with them; once the executor
    no longer offers it (restarted with --no-head-loss, say), new jobs count them again."""
    shape = model_shape("llama-1b")
    offered = [True]
    budget = JobBudget(int(2.5 * JobBudget(0, shape).cost(False)), shape, lambda: offered[0])
    store, scheduler, seen = scheduler_with(tmp_path, max_jobs=8, budget=budget)
    jobs = [create(scheduler) for _ in range(3)]
    on_head = create(scheduler, targets=["q_proj", "lm_head"])
    assert seen.started == jobs and store.get(on_head).status == "queued"
    waiting = [e["message"] for e in store.events(on_head, after=None, limit=10)[0]
               if e["message"].startswith("Waiting for memory")]
    assert waiting == ["Waiting for memory: running jobs may take 28.1 GiB of the 29.1 GiB for "
                       "jobs, and this one up to 11.6 GiB"]
    for pid, job in ((11, jobs[0]), (12, jobs[1])):
        scheduler.spawned(job, pid)
        store.move(job, "succeeded")
        assert scheduler.exited(pid, 0)
    assert seen.started[3:] == [on_head]  # 9.4 + 11.6 GiB fit
    offered[0] = False
    late = create(scheduler)
    assert store.get(late).status == "queued"
    waiting = [e["message"] for e in store.events(late, after=None, limit=10)[0]
               if e["message"].startswith("Waiting for memory")]
    assert waiting == ["Waiting for memory: running jobs may take 21.0 GiB of the 29.1 GiB for "
                       "jobs, and this one up to 11.6 GiB"]


def test_a_waiting_job_paused_or_cancelled_is_forgotten_and_told_again_once_resumed(
        tmp_path) -> None:
    shape = model_shape("llama-1b")
    budget = JobBudget(int(1.5 * JobBudget(0, shape).cost(False)), shape)
    store, scheduler, seen = scheduler_with(tmp_path, max_jobs=8, budget=budget)
    first, cancelled, paused = (create(scheduler) for _ in range(3))
    assert seen.started == [first] and scheduler.told_to_wait == {cancelled}  # the queue's head
    scheduler.command(b"gw", JobCommand("c", cancelled, JobAction.CANCEL))
    assert scheduler.told_to_wait == {paused}  # now the head
    scheduler.command(b"gw", JobCommand("p", paused, JobAction.PAUSE))
    assert scheduler.told_to_wait == set()
    assert [store.get(j).status for j in (cancelled, paused)] == ["cancelled", "paused"]
    scheduler.command(b"gw", JobCommand("r", paused, JobAction.RESUME))
    waiting = [e["message"] for e in store.events(paused, after=None, limit=20)[0]
               if e["message"].startswith("Waiting for memory")]
    assert len(waiting) == 2 and scheduler.told_to_wait == {paused}


def test_a_job_larger_than_the_budget_still_runs_alone(tmp_path) -> None:
    shape = model_shape("llama-1b")
    store, scheduler, seen = scheduler_with(tmp_path, max_jobs=4, budget=JobBudget(1, shape))
    first, second = create(scheduler), create(scheduler)
    assert seen.started == [first] and store.get(second).status == "queued"

"""The manager's fine-tuning queue as its tests drive it: a real job store and recorded
messages in place of sockets and the spawner."""

from __future__ import annotations

from gateway.job_spec import JobSpec, PeftSpec
from state.db import Database
from state.jobs import new_id
from wire.jobs import (
    JobAction,
    JobCommand,
    JobState,
    NewJob,
    TrainerAck,
    TrainerControl,
    TrainerThreads,
)
from workers.manager.capacity import JobBudget, ThreadShare
from workers.manager.file_store import FileStore
from workers.manager.job_ledger import JobLedger
from workers.manager.job_store import JobStore
from workers.manager.jobs import JobScheduler


class Recorder:
    def __init__(self) -> None:
        self.started: list[str] = []
        self.answers: list[tuple[bytes, JobState]] = []
        self.controls: list[tuple[str, TrainerControl]] = []
        self.acks: list[str] = []
        self.spawned_on: dict[str, int] = {}  # job id -> the threads its trainer's spec gave
        self.threads: list[TrainerThreads] = []  # told to running trainers

    def spec(self, job, threads: int):
        self.spawned_on[job.id] = threads
        return job  # its id is all these tests look at

    def to_trainer(self, job_id: str, message) -> None:
        if isinstance(message, TrainerAck):
            self.acks.append(job_id)
        elif isinstance(message, TrainerThreads):
            self.threads.append(message)
        else:
            self.controls.append((job_id, message))


def scheduler_with(tmp_path, max_jobs: int, budget: JobBudget | None = None,
                   threads: ThreadShare | None = None) -> tuple[JobStore, JobScheduler, Recorder]:
    db = Database(tmp_path / "state.db")
    store, files = JobStore(db), FileStore(db, tmp_path)
    seen = Recorder()
    scheduler = JobScheduler(
        JobLedger(store, files, tmp_path), lambda spec: seen.started.append(spec.id),
        seen.spec,
        lambda gateway, state: seen.answers.append((gateway, state)),
        seen.to_trainer, max_jobs=max_jobs, budget=budget, threads=threads)
    return store, scheduler, seen


def new_job(tenant: str = "acme", priority: int = 0, problem: str | None = None,
            recompute: bool = False, targets: list[str] | None = None) -> NewJob:
    peft = PeftSpec(gradient_checkpointing=recompute, target_modules=targets)
    return NewJob(tenant=tenant, model="m", training_file="file", seed=1,
                  spec=JobSpec(1, 1, 1.0, peft), priority=priority, problem=problem)


def create(scheduler: JobScheduler, tenant: str = "acme", priority: int = 0,
           recompute: bool = False, targets: list[str] | None = None) -> str:
    """A job as the gateway creates one: a command, answered once the job is stored."""
    job_id = new_id("ftjob")
    scheduler.command(b"gw", JobCommand(f"new-{job_id}", job_id, JobAction.CREATE,
                                        new_job(tenant, priority, recompute=recompute,
                                                targets=targets)))
    return job_id


def running_job(scheduler: JobScheduler, pid: int) -> str:
    """A job created into a free slot whose trainer (process `pid`) has said hello."""
    job = create(scheduler)
    scheduler.spawned(job, pid)
    scheduler.hello(job)
    return job

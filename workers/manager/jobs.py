"""The fine-tuning queue, run by the worker manager: which jobs train, what a pause or cancel
means for a running one, and what a dead trainer means. Torch-free; driven by events, not by
polling: a gateway's command (create, pause, cancel, resume), a trainer that stopped or exited.

At start, jobs left "running" by a previous stack (no trainer of ours) go back to the queue,
where they resume from their latest checkpoint. Queued jobs start, up to `max_jobs` at once,
fairly across tenants. A pause or cancel for a running job goes to its trainer, which acts
between two steps; every gateway request waiting on it is answered when it did. A trainer that
exits while its job is still "running" crashed or lost the executor: the job is requeued up to
`max_attempts` times, then failed (or paused or cancelled, if that was asked of it). What a
trainer reports is recorded by the `JobLedger`; its last report (finished or stopped) is
acknowledged before it exits, so its exit never races its final status. As jobs start and end,
running trainers are told their share of the cores (`ThreadShare`).
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

import msgspec

from state.jobs import JobRecord
from wire.jobs import (
    JobAction,
    JobCommand,
    JobState,
    JobStatus,
    TrainerAck,
    TrainerControl,
    TrainerReport,
    TrainerThreads,
)
from wire.spawner import TrainerSpec
from workers.manager.capacity import JobBudget, ThreadShare
from workers.manager.job_ledger import JobLedger

log = logging.getLogger("workers.jobs")

Answer = Callable[[bytes, JobState], None]  # to the gateway that asked
ToTrainer = Callable[[str, msgspec.Struct], None]  # to a job's trainer: control or ack


@dataclass
class Trainer:
    job_id: str
    pid: int = 0
    connected: bool = False
    asked: JobAction | None = None  # pause or cancel, sent or to send once it says hello
    waiting: list[tuple[bytes, str]] = field(default_factory=list)  # (gateway, request id)
    resume: tuple[bytes, str] | None = None  # a resume that came before it exited: after it
    bytes: int = 0  # what its job may take at most (`capacity.JobBudget`)
    threads: int = 1  # its torch threads as it last heard them (its spec's, `TrainerThreads`)


class JobScheduler:
    def __init__(self, ledger: JobLedger, start: Callable[[TrainerSpec], None],
                 trainer_spec: Callable[[JobRecord, int], TrainerSpec], answer: Answer,
                 to_trainer: ToTrainer, *, max_jobs: int, budget: JobBudget | None = None,
                 max_attempts: int = 3, threads: ThreadShare | None = None) -> None:
        self.ledger = ledger
        self.jobs = ledger.jobs
        self.start = start  # asks the spawner for a trainer process
        self.trainer_spec = trainer_spec  # a job's, given its torch threads
        self.answer = answer
        self.to_trainer = to_trainer
        self.max_jobs = max_jobs  # the config's, or `capacity.default_capacity`'s
        self.budget = budget  # by default, the memory the running jobs share
        self.max_attempts = max_attempts
        self.threads = threads or ThreadShare(cores=1)  # by default one thread each
        self.share = 0  # the running trainers' threads, as last logged
        self.trainers: dict[str, Trainer] = {}  # job id -> its trainer (starting or running)
        self.told_to_wait: set[str] = set()  # jobs whose events say they wait for memory

    @property
    def running(self) -> int:
        return len(self.trainers)

    def recover(self) -> None:
        for job in self.jobs.with_status("running"):
            if self.jobs.move(job.id, "queued"):
                log.info("job %s was running when the stack stopped: requeued", job.id)
                self.jobs.event(job.id, "The service restarted; the job will resume from its "
                                "latest checkpoint", level="warn")
        self.schedule()

    def schedule(self) -> None:
        free = self.max_jobs - self.running
        if free <= 0:
            self._preempt()
            return
        costs: dict[str, int] = {}
        told: list[tuple[str, str]] = []  # (job id, its event): written after the claim
        claimed = self.jobs.claim(self.max_jobs, slots=free,
                                  fits=partial(self._fits, costs, told))
        threads = self.threads.of(self.running + len(claimed))
        for job in claimed:
            log.info("starting trainer for job %s (tenant %s) on %d threads", job.id,
                     job.tenant, threads)
            self.trainers[job.id] = Trainer(job.id, bytes=costs.get(job.id, 0),
                                            threads=threads)
            self.start(self.trainer_spec(job, threads))
        for job_id, message in told:
            self.jobs.event(job_id, message)
        self._share_cores()

    def _share_cores(self) -> None:
        """Every trainer on the share of the cores for as many jobs as run now: told at once
        if it said hello, else when it does."""
        threads = self.threads.of(self.running)
        if threads != self.share and self.running:
            log.info("%d job(s) running: each trainer on %d threads", self.running, threads)
            self.share = threads
        for trainer in self.trainers.values():
            if trainer.connected:
                self._tell_threads(trainer, threads)

    def _tell_threads(self, trainer: Trainer, threads: int) -> None:
        if trainer.threads != threads:
            trainer.threads = threads
            self.to_trainer(trainer.job_id, TrainerThreads(trainer.job_id, threads))

    def _fits(self, costs: dict[str, int], told: list[tuple[str, str]], job: JobRecord) -> bool:
        """Whether the job's memory fits beside the running jobs' and those claimed with it
        (`costs`); the first job always does, so that the queue moves. A job that waits is told
        so once, in its events (`told`)."""
        if self.budget is None:
            return True
        cost = self.budget.cost_of(job.method)
        taken = sum(t.bytes for t in self.trainers.values()) + sum(costs.values())
        if taken and taken + cost > self.budget.bytes:
            if job.id not in self.told_to_wait:
                self.told_to_wait.add(job.id)
                told.append((job.id, f"Waiting for memory: running jobs may take "
                             f"{taken / 2**30:.1f} GiB of the {self.budget.bytes / 2**30:.1f} GiB "
                             f"for jobs, and this one up to {cost / 2**30:.1f} GiB"))
            return False
        self.told_to_wait.discard(job.id)
        costs[job.id] = cost
        return True

    def _preempt(self) -> None:
        """Slots full and a queued job outranks a running one: the lowest-priority running job
        checkpoints and goes back to the queue (one at a time; its exit schedules again)."""
        if any(t.asked == JobAction.PREEMPT for t in self.trainers.values()):
            return
        waiting = max((j.priority for j in self.jobs.with_status("queued")), default=None)
        running = [(self.jobs.get(t.job_id), t) for t in self.trainers.values()
                   if t.asked is None]
        running = [(job, t) for job, t in running if job is not None and job.status == "running"]
        if waiting is None or not running:
            return
        job, trainer = min(running, key=lambda pair: (pair[0].priority, -(pair[0].queued_at or 0)))
        if job.priority >= waiting:
            return
        log.info("preempting job %s (priority %d) for a queued job of priority %d", job.id,
                 job.priority, waiting)
        trainer.asked = JobAction.PREEMPT
        if trainer.connected:
            self.to_trainer(job.id, TrainerControl(job.id, JobAction.PREEMPT))

    # -- events ----------------------------------------------------------------------------

    def command(self, gateway: bytes, command: JobCommand) -> None:
        """A gateway's command: answered at once, or for a running job's pause or cancel once
        its trainer stopped."""
        action, job_id = command.action, command.job_id
        trainer = self.trainers.get(job_id)
        if action in (JobAction.PAUSE, JobAction.CANCEL) and trainer is not None:
            trainer.waiting.append((gateway, command.id))
            if trainer.asked != JobAction.CANCEL:  # a user's pause or cancel outranks preempting
                trainer.asked = action
            if trainer.connected:
                self.to_trainer(job_id, TrainerControl(job_id, trainer.asked))
            return
        if action == JobAction.RESUME and trainer is not None:  # paused, not yet gone: its
            trainer.resume = (gateway, command.id)  # checkpoint is whole once it exited
            return
        try:
            moved = self._act(command)
        except (sqlite3.Error, OSError):  # a full disk, say: the gateway is told, we serve on
            log.exception("job %s: %s not recorded", job_id, action)
            self.answer(gateway, JobState(command.id, job_id, JobStatus.UNKNOWN, False))
            return
        self.schedule()
        self._answer_now(gateway, command, moved)

    def _act(self, command: JobCommand) -> bool:
        """A command for a job no trainer runs; whether it took effect."""
        if command.action == JobAction.CREATE and command.new is not None:
            self.ledger.create(command.job_id, command.new)
            return True
        if command.action in (JobAction.PAUSE, JobAction.CANCEL):
            stopped = self.ledger.stop_idle(command.job_id, command.action)
            if stopped:  # no longer waiting: once resumed, a wait is told anew
                self.told_to_wait.discard(command.job_id)
            return stopped
        if command.action == JobAction.RESUME:
            return self.ledger.resume(command.job_id)
        return False

    def spawned(self, job_id: str, pid: int) -> None:
        if job_id in self.trainers:
            self.trainers[job_id].pid = pid

    def hello(self, job_id: str) -> None:
        trainer = self.trainers.get(job_id)
        if trainer is None:
            return
        trainer.connected = True
        if trainer.asked is not None:
            self.to_trainer(job_id, TrainerControl(job_id, trainer.asked))
        self._tell_threads(trainer, self.threads.of(self.running))

    def report(self, report: TrainerReport) -> None:
        """Record what a trainer reports; its last report is acknowledged (it may then exit)
        and answers the gateways waiting on the job."""
        try:
            status = self.ledger.record(report)
        except (sqlite3.Error, OSError):  # a full disk, say: the manager serves on
            log.exception("job %s: a trainer's report was not recorded", report.job_id)
            return  # a last report left unacknowledged: its trainer exits, the job is retried
        if status is None:
            return
        self.to_trainer(report.job_id, TrainerAck(report.job_id))
        trainer = self.trainers.get(report.job_id)
        if trainer is not None:
            self._release(trainer, status)

    def exited(self, pid: int, status: int) -> bool:
        """A process ended; True if it was one of our trainers."""
        trainer = next((t for t in self.trainers.values() if t.pid == pid), None)
        if trainer is None:
            return False
        del self.trainers[trainer.job_id]
        job = self.jobs.get(trainer.job_id)
        if job is not None and job.status == "running":
            self._after_crash(trainer, job.attempts, status)
        job = self.jobs.get(trainer.job_id)
        self._release(trainer, job.status if job else "failed")
        if trainer.resume is not None:
            gateway, request = trainer.resume
            self.command(gateway, JobCommand(request, trainer.job_id, JobAction.RESUME))
        self.schedule()  # a queued job starts, and the running ones share the cores anew
        return True

    # -- internals -------------------------------------------------------------------------

    def _after_crash(self, trainer: Trainer, attempts: int, status: int) -> None:
        job_id = trainer.job_id
        if trainer.asked == JobAction.PREEMPT:  # it died before giving its slot back
            if self.jobs.move(job_id, "queued"):
                self.jobs.event(job_id, "Preempted by a job of higher priority; it will resume "
                                "from its latest checkpoint")
        elif trainer.asked is not None:  # it died before acting on a pause or cancel: honour it
            final = "paused" if trainer.asked == JobAction.PAUSE else "cancelled"
            if self.jobs.move(job_id, final):
                self.jobs.event(job_id, f"Job {final}; it will resume from its latest "
                                "checkpoint" if final == "paused" else f"Job {final}")
        elif attempts < self.max_attempts:
            log.warning("trainer of job %s exited with %s: requeued", job_id, status)
            if self.jobs.move(job_id, "queued"):
                self.jobs.event(job_id, f"The trainer stopped unexpectedly (exit {status}); the "
                                "job will resume from its latest checkpoint", level="warn")
        else:
            message = f"The trainer failed {attempts} times (last exit {status})"
            if self.jobs.move(job_id, "failed", error={"code": "trainer_failed",
                                                        "message": message, "param": None}):
                self.jobs.event(job_id, message, level="error")

    def _release(self, trainer: Trainer, status: str) -> None:
        for gateway, request in trainer.waiting:
            self.answer(gateway, JobState(request, trainer.job_id, JobStatus(status)))
        trainer.waiting.clear()

    def _answer_now(self, gateway: bytes, command: JobCommand, moved: bool) -> None:
        job = self.jobs.get(command.job_id)
        self.answer(gateway, JobState(command.id, command.job_id,
                                      JobStatus(job.status) if job else JobStatus.UNKNOWN,
                                      moved and job is not None))

"""The fine-tuning queue, run by the worker manager: which jobs train, and what a dead trainer
means. Torch-free.

Each tick: jobs left "running" by a previous stack (no trainer of ours) go back to the queue,
where they resume from their latest checkpoint; queued jobs start, up to `max_jobs` at once,
fairly across tenants. A trainer that exits while its job is still "running" crashed or lost
the executor: the job is requeued up to `max_attempts` times, then failed.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path

from state.db import Database
from state.jobs import JobStore

log = logging.getLogger("workers.jobs")


def default_max_jobs() -> int:
    return max(2, (os.cpu_count() or 2) // 2)


class JobScheduler:
    def __init__(self, data_dir: Path, start: Callable[[dict], None], *, base: str,
                 executor: str, max_jobs: int = 0, max_attempts: int = 3) -> None:
        self.jobs = JobStore(Database(data_dir / "state.db"))
        self.data_dir = data_dir
        self.start = start  # asks the spawner for a trainer process
        self.base = base
        self.executor = executor
        self.max_jobs = max_jobs or default_max_jobs()
        self.max_attempts = max_attempts
        self.trainers: dict[int, str] = {}  # pid -> job id
        self.starting: set[str] = set()  # job ids asked for, pid not known yet
        self._recovered = False

    def tick(self) -> None:
        if not self._recovered:
            self._recovered = True
            for job in self.jobs.with_status("running"):
                log.info("job %s was running when the stack stopped: requeued", job.id)
                self.jobs.update(job.id, status="queued")
                self.jobs.event(job.id, "The service restarted; the job will resume from its "
                                "latest checkpoint", level="warn")
        for job in self.jobs.claim(self.max_jobs):
            log.info("starting trainer for job %s (tenant %s)", job.id, job.tenant)
            self.starting.add(job.id)
            self.start({"job_id": job.id, "data_dir": str(self.data_dir), "base": self.base,
                        "executor": self.executor})

    def spawned(self, job_id: str, pid: int) -> None:
        self.starting.discard(job_id)
        self.trainers[pid] = job_id

    def exited(self, pid: int, status: int) -> bool:
        """A process ended; True if it was one of our trainers."""
        job_id = self.trainers.pop(pid, None)
        if job_id is None:
            return False
        job = self.jobs.get(job_id)
        if job is None or job.status != "running":
            return True
        if job.attempts < self.max_attempts:
            log.warning("trainer of job %s exited with %s: requeued", job_id, status)
            self.jobs.update(job_id, status="queued")
            self.jobs.event(job_id, f"The trainer stopped unexpectedly (exit {status}); the job "
                            "will resume from its latest checkpoint", level="warn")
        else:
            message = f"The trainer failed {job.attempts} times (last exit {status})"
            self.jobs.update(job_id, status="failed",
                             error={"code": "trainer_failed", "message": message, "param": None})
            self.jobs.event(job_id, message, level="error")
        return True

    @property
    def running(self) -> int:
        return len(self.trainers) + len(self.starting)

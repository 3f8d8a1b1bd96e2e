"""The manager's record of its jobs: the one writer of the jobs table. It stores the jobs the
gateway asks for (`NewJob`), moves jobs that are not training (pause, cancel, resume), and
records what trainers report: events, checkpoints, registered adapters, result file and final
status. A trainer never opens the database; it sends `wire.jobs.TrainerReport`s on its control
channel and this records them in order (one socket per trainer keeps them in the order sent)."""

from __future__ import annotations

import logging
import sqlite3
from pathlib import Path

from catalogue.paths import local_path
from state.jobs import JobRecord
from wire.jobs import (
    JobAction,
    JobStatus,
    NewJob,
    TrainerCheckpoint,
    TrainerEvent,
    TrainerFinished,
    TrainerReport,
    TrainerStarted,
    TrainerStopped,
)
from workers.manager.adapter_store import AdapterError, AdapterRegistry
from workers.manager.file_store import FileStore
from workers.manager.job_store import JobStore

log = logging.getLogger("workers.jobs")


class JobLedger:
    def __init__(self, jobs: JobStore, files: FileStore, data_dir: Path) -> None:
        self.jobs = jobs
        self.files = files
        self.data_dir = data_dir

    def create(self, job_id: str, new: NewJob) -> JobRecord:
        """Store a job the gateway validated: queued, or failed at once with its problem. The
        same command again (a retry) finds the job it made."""
        if (known := self.jobs.get(job_id)) is not None:
            return known
        job = self.jobs.create(job_id, new)
        self.jobs.event(job.id, f"Validating training file: {new.training_file}")
        if new.problem is not None:
            self.jobs.move(job.id, "failed", error={"code": "invalid_n_examples",
                                                    "message": new.problem,
                                                    "param": "training_file"})
            self.jobs.event(job.id, new.problem, level="error")
        elif self.jobs.move(job.id, "queued"):
            self.jobs.event(job.id, "Files validated, moving job to queued state")
        return self.jobs.get(job.id)

    def stop_idle(self, job_id: str, action: JobAction) -> bool:
        """Pause or cancel a job that no trainer runs; False if its status does not allow it."""
        final = "paused" if action == JobAction.PAUSE else "cancelled"
        if not self.jobs.move(job_id, final):
            return False
        self.jobs.event(job_id, f"Job {final}")
        return True

    def resume(self, job_id: str) -> bool:
        """A paused job back to the queue (from its latest checkpoint); False if not paused."""
        if not self.jobs.move(job_id, "queued", attempts=0):
            return False
        self.jobs.event(job_id, "Job resumed; queued to continue from its latest checkpoint")
        return True

    def record(self, report: TrainerReport) -> JobStatus | None:
        """Record one report; for the last (finished or stopped), the status the job is in
        now (the trainer may exit once it is acknowledged)."""
        job = self.jobs.get(report.job_id)
        if job is None:
            return JobStatus.UNKNOWN if isinstance(report, (TrainerFinished, TrainerStopped)) \
                else None
        if isinstance(report, TrainerEvent):
            self.jobs.event(job.id, report.message, level=report.level, type=report.kind,
                            data=report.data)
        elif isinstance(report, TrainerStarted):
            self._started(job, report)
        elif isinstance(report, TrainerCheckpoint):
            self._checkpoint(job, report)
        elif isinstance(report, TrainerFinished):
            return self._finished(job, report)
        elif isinstance(report, TrainerStopped):
            return self._stopped(job, report)
        return None

    def _started(self, job: JobRecord, report: TrainerStarted) -> None:
        redone = self.jobs.forget_steps_after(job.id, report.resumed_step)
        how = f"resumed at step {report.resumed_step}" if report.resumed_step else "started"
        if redone:
            how += f" (the steps after it are redone; {redone} of their events dropped)"
        self.jobs.event(job.id, f"Fine-tuning job {how}: {report.detail}")

    def _checkpoint(self, job: JobRecord, report: TrainerCheckpoint) -> None:
        if self.jobs.has_checkpoint(job.id, report.step):
            return  # told again by a resuming trainer (its model may have been deleted since)
        model_id = f"{job.model_id}:ckpt-step-{report.step}"
        registry = self._registry(job)
        try:
            self._own(job, report.path)
            if registry.get(model_id) is None:
                registry.register(job.tenant, "", Path(report.path), model_id=model_id,
                                  origin="checkpoint", job_id=job.id)
        except (AdapterError, OSError, sqlite3.Error) as exc:  # the job goes on; its files stay
            log.warning("job %s: checkpoint at step %d not registered: %s", job.id,
                        report.step, exc)
            self.jobs.event(job.id, f"Checkpoint at step {report.step} saved but not "
                            f"registered as a model: {exc}", level="warn")
            return
        self.jobs.add_checkpoint(job.id, report.step, report.epoch, model_id, report.metrics,
                                 report.path)
        self.jobs.event(job.id, f"Checkpoint created at step {report.step}: {model_id}")

    def _finished(self, job: JobRecord, report: TrainerFinished) -> JobStatus:
        passed = bool(report.gates.get("passed"))
        try:
            results = self._store_results(job, report, passed)
        except (AdapterError, OSError, sqlite3.Error) as exc:
            log.exception("job %s: its result could not be stored", job.id)
            return self._stopped(job, TrainerStopped(
                job.id, JobStatus.FAILED, f"The job's result could not be stored: {exc}",
                "result_not_stored"))
        self.jobs.event(job.id, f"New fine-tuned model created: {job.model_id}" + (
            "" if passed else " (a candidate, not in service: it failed a quality gate; "
            f"POST /v1/adapters/{job.model_id}/promote serves it anyway)"),
            level="info" if passed else "warn")
        if not self.jobs.move(job.id, "succeeded", fine_tuned_model=job.model_id,
                              trained_tokens=report.trained_tokens, result_files=[results],
                              gates=report.gates):
            return self._status(job.id)
        self.jobs.event(job.id, "The job has successfully completed")
        return JobStatus.SUCCEEDED

    def _store_results(self, job: JobRecord, report: TrainerFinished, passed: bool) -> str:
        """Register the adapter (and the named version it was asked to be); store the results
        file. Returns the file's id."""
        registry, source = self._registry(job), self._own(job, report.adapter_path)
        if registry.get(job.model_id) is None:
            registry.register(job.tenant, "", source, model_id=job.model_id, origin="fine-tune",
                              job_id=job.id, in_service=passed, lineage=report.lineage)
        name = job.spec.peft.register_as
        if name and not any(v.job_id == job.id
                            for v in registry.versions.list(f"{job.tenant}/{name}")):
            version = registry.register(job.tenant, name, source, origin="fine-tune",
                                        job_id=job.id, in_service=passed,
                                        lineage=report.lineage)
            self.jobs.event(job.id, f"Registered as {version.id}" + (
                ", now serving" if passed else
                ", a candidate version (it failed a quality gate)"))
        return self.files.create(job.tenant, f"{job.id}-results.csv", "fine-tune-results",
                                 report.results_csv).id

    def _stopped(self, job: JobRecord, report: TrainerStopped) -> JobStatus:
        failed = report.status == JobStatus.FAILED
        error = {"error": {"code": report.error_code, "message": report.message,
                           "param": report.error_param}} if failed else {}
        if self.jobs.move(job.id, report.status.value, **error) and report.message:
            self.jobs.event(job.id, report.message, level="error" if failed else "info")
        return self._status(job.id)

    def _status(self, job_id: str) -> JobStatus:
        current = self.jobs.get(job_id)
        return JobStatus(current.status) if current else JobStatus.UNKNOWN

    def _own(self, job: JobRecord, path: str) -> Path:
        """A directory a trainer names: only inside its job's own directory."""
        resolved = Path(path).resolve()
        if not resolved.is_relative_to((self.data_dir / "jobs" / job.id).resolve()):
            raise AdapterError(f"{path} is outside the job's directory")
        return resolved

    def _registry(self, job: JobRecord) -> AdapterRegistry:
        return AdapterRegistry(self.jobs.db, self.data_dir, job.model, local_path(job.model))

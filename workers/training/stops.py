"""How a run ends before its job does: a pause, cancel or preemption the manager asks for, or the
service stopping (SIGTERM), between two steps (after a checkpoint) or before the run's first
(DPO's reference pass: the job keeps its latest checkpoint, if any)."""

from __future__ import annotations

from wire.jobs import JobAction, JobStatus, TrainerStopped

RETRY = 75  # exit status: the job stays running, so the manager requeues it
BEFORE_START = "before this run's first step"


class JobStopped(Exception):
    """Paused, cancelled, preempted or the service stopping, between two steps or before the
    first; `code` is the process's exit status."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


def stopped(job_id: str, action: JobAction, step: int | None) -> TrainerStopped:
    """The last report of a run the manager stopped: at `step` with a checkpoint saved, or
    (None) before its first step."""
    status = {JobAction.PAUSE: JobStatus.PAUSED,
              JobAction.PREEMPT: JobStatus.QUEUED}.get(action, JobStatus.CANCELLED)
    at = BEFORE_START if step is None else f"at step {step}"
    if status == JobStatus.QUEUED:
        return TrainerStopped(job_id, status, f"Preempted by a job of higher priority {at}; it "
                              "will resume from " + ("its latest checkpoint" if step is None
                                                     else "this checkpoint"))
    return TrainerStopped(job_id, status, f"Job {status} {at}" + (
        "" if step is None else "; checkpoint saved"))


def service_stopping(step: int | None, resumes_from: str = "") -> str:
    """The event of a run the service's stop ends: at `step` with a checkpoint saved, or (None)
    before its first step, the job resuming from `resumes_from`."""
    if step is None:
        return f"The service is stopping {BEFORE_START}; the job resumes from {resumes_from}"
    return f"The service is stopping: checkpoint saved at step {step}; the job resumes from it"

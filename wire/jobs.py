"""Fine-tuning job control: gateway -> worker manager -> trainer, and back. Typed, torch-free.

The gateway stores a new job as queued and sends `JobCommand(START)`, so the manager claims it
at once; pausing or cancelling a running job is `JobCommand(PAUSE | CANCEL)`, which the manager
forwards to the job's trainer as `TrainerControl`. The trainer acts on it between two optimizer
steps (checkpoint, then the new status in the job store) and says `TrainerStopped`; the manager
answers every gateway request waiting on that job with `JobState`.
"""

from __future__ import annotations

import enum

import msgspec


class JobStatus(enum.StrEnum):
    """A job's status (`state.job_states` moves between them)."""

    VALIDATING_FILES = "validating_files"
    QUEUED = "queued"
    RUNNING = "running"
    PAUSED = "paused"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    UNKNOWN = "unknown"  # no such job, or no job queue (a manager without a data dir)


class JobAction(enum.StrEnum):
    START = "start"  # a job was queued (created or resumed): claim it if a slot is free
    PAUSE = "pause"
    CANCEL = "cancel"
    PREEMPT = "preempt"  # manager -> trainer only: checkpoint and give the slot back (queued)


class JobCommand(msgspec.Struct, tag="job_command", array_like=True):
    id: str  # request id, echoed in the JobState answer
    job_id: str
    action: JobAction


class JobState(msgspec.Struct, tag="job_state", array_like=True):
    id: str  # the JobCommand's request id
    job_id: str
    status: JobStatus  # once the command took effect (or could not)


class TrainerHello(msgspec.Struct, tag="trainer_hello", array_like=True):
    job_id: str
    pid: int


class TrainerControl(msgspec.Struct, tag="trainer_control", array_like=True):
    job_id: str
    action: JobAction  # PAUSE or CANCEL


class TrainerStopped(msgspec.Struct, tag="trainer_stopped", array_like=True):
    job_id: str
    status: JobStatus  # paused | cancelled | succeeded | failed


JobMessage = JobCommand | JobState | TrainerHello | TrainerControl | TrainerStopped

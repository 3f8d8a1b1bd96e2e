"""Fine-tuning job control: gateway -> worker manager -> trainer, and back. Typed, torch-free.

The manager is the one writer of job state; the gateway reads jobs and sends commands. A new
job is `JobCommand(CREATE)` carrying the validated request (`NewJob`); `PAUSE`, `CANCEL` and
`RESUME` act on a job, and the manager answers each with `JobState` once it took effect: at once
for a job that is not training, and for a running one once its trainer stopped (the manager
forwards a pause or cancel to it as `TrainerControl`, and the torch threads it may use as jobs
start and end as `TrainerThreads`). The manager gives a trainer its job
(`TrainerJob`, in the trainer's spawn spec), and the trainer reports on its control channel
(`TrainerReport`: started, events, checkpoints, then finished or stopped); the manager records
each and acknowledges the last (`TrainerAck`) before the trainer exits. Neither the gateway nor
a trainer writes a job.
"""

from __future__ import annotations

import enum

import msgspec
import msgspec.structs


class JobStatus(enum.StrEnum):
    """A job's status (`workers.manager.job_states` moves between them)."""

    VALIDATING_FILES = "validating_files"
    QUEUED = "queued"
    RUNNING = "running"
    PAUSED = "paused"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    UNKNOWN = "unknown"  # no such job, or no job queue (a manager without a data dir)


TERMINAL = ("succeeded", "failed", "cancelled")  # a job's final statuses


class JobAction(enum.StrEnum):
    CREATE = "create"  # store the command's `NewJob` under its job id and queue it
    PAUSE = "pause"
    CANCEL = "cancel"
    RESUME = "resume"  # a paused job goes back to the queue
    PREEMPT = "preempt"  # manager -> trainer only: checkpoint and give the slot back (queued)


class TrainerHello(msgspec.Struct, tag="trainer_hello", array_like=True):
    job_id: str
    pid: int


class TrainerControl(msgspec.Struct, tag="trainer_control", array_like=True):
    job_id: str
    action: JobAction  # PAUSE or CANCEL


class TrainerThreads(msgspec.Struct, tag="trainer_threads", array_like=True):
    job_id: str
    threads: int  # torch threads from its next step on (`workers.manager.capacity.ThreadShare`)


DEFAULT_MAX_SEQ_LENGTH = 1024
ALL_LINEAR = "all-linear"  # peft's word for every linear layer but the head


class PeftSpec(msgspec.Struct, frozen=True, kw_only=True):
    """The `peft` block of a job: which PEFT method and its settings, every default resolved
    (`gateway.job_spec.resolve`)."""

    method: str = "lora"
    r: int = 8
    alpha: int = 16
    dropout: float = 0.0
    target_modules: list[str] | None = None
    feedforward_modules: list[str] | None = None
    num_virtual_tokens: int = 10
    max_seq_length: int = DEFAULT_MAX_SEQ_LENGTH
    learning_rate: float = 2e-4
    warmup_ratio: float = 0.1
    weight_decay: float = 0.0
    checkpoint_every_steps: int = 0  # besides one per epoch; 0: per epoch only
    gradient_checkpointing: bool = False  # recompute each decoder layer in the backward
    init_model: str | None = None  # continue training this fine-tuned model or checkpoint...
    init_adapter: str | None = None  # ...whose adapter directory this is
    gates: dict | None = None  # quality gates (openapi.fine_tuning.Gates); None: the defaults
    register_as: str | None = None  # the result is also the next version of this adapter name


class JobSpec(msgspec.Struct, frozen=True):
    """What a job trains with, one typed object from the API edge to the trainer's loop: made
    by `gateway.job_spec.resolve` when the job is created, stored (its JSON), handed to the
    trainer in `TrainerJob`."""

    n_epochs: int
    batch_size: int
    learning_rate_multiplier: float
    peft: PeftSpec = msgspec.field(default_factory=PeftSpec)
    beta: float | None = None  # a DPO job's (preference pairs); None: supervised

    @property
    def method(self) -> str:
        """OpenAI's `method.type`."""
        return "supervised" if self.beta is None else "dpo"

    def hyperparameters(self) -> dict:
        """OpenAI's `hyperparameters` object, resolved (a DPO job's with its beta)."""
        return {"n_epochs": self.n_epochs, "batch_size": self.batch_size,
                "learning_rate_multiplier": self.learning_rate_multiplier,
                **({} if self.beta is None else {"beta": self.beta})}

    def peft_dict(self) -> dict:
        return msgspec.structs.asdict(self.peft)

    @classmethod
    def from_stored(cls, hyperparameters: dict, peft: dict) -> JobSpec:
        """From the job's two JSON columns, checked against these types."""
        return msgspec.convert({**hyperparameters, "peft": peft}, cls, strict=False)


class NewJob(msgspec.Struct, frozen=True, kw_only=True):
    """A job as the gateway validated it (`JobCommand(CREATE)`): the manager stores it, then
    queues it, or fails it at once with `problem` (the training file cannot train)."""

    tenant: str
    model: str  # the base model's name
    training_file: str
    validation_file: str | None = None
    suffix: str | None = None
    seed: int
    spec: JobSpec
    metadata: dict[str, str] | None = None
    priority: int = 0
    problem: str | None = None


class JobCommand(msgspec.Struct, tag="job_command", array_like=True):
    id: str  # request id, echoed in the JobState answer
    job_id: str  # for CREATE, the id the new job gets (chosen by the gateway: a retry finds it)
    action: JobAction
    new: NewJob | None = None  # CREATE only


class JobState(msgspec.Struct, tag="job_state", array_like=True):
    id: str  # the JobCommand's request id
    job_id: str
    status: JobStatus  # once the command took effect (or could not)
    moved: bool = True  # False: the job's status did not allow the command (`status` is it)


class TrainerJob(msgspec.Struct, frozen=True, kw_only=True):
    """What a trainer runs: the stored job, its files resolved to paths by the manager."""

    id: str
    tenant: str
    model: str  # the base model's name
    model_id: str  # the fine-tuned model's id (`ft:...`)
    seed: int
    spec: JobSpec
    training_file: str
    training_path: str
    validation_file: str | None = None
    validation_path: str | None = None


class TrainerStarted(msgspec.Struct, tag="trainer_started", array_like=True):
    job_id: str
    resumed_step: int  # the checkpoint's step it continues from; 0: a fresh start
    detail: str  # "N examples, E epoch(s), T steps"


class TrainerEvent(msgspec.Struct, tag="trainer_event", array_like=True):
    job_id: str
    message: str
    level: str = "info"
    kind: str = "message"  # the event's type; "metrics": `data` holds a step's figures
    data: dict | None = None


class TrainerCheckpoint(msgspec.Struct, tag="trainer_checkpoint", array_like=True):
    job_id: str
    step: int
    epoch: int
    metrics: dict
    path: str  # the checkpoint's directory (its adapter is registered as `model_id:ckpt-step-N`)


class TrainerFinished(msgspec.Struct, tag="trainer_finished", array_like=True):
    job_id: str
    adapter_path: str  # the trained adapter's directory, registered as the job's model
    gates: dict  # the quality gates' verdict: {"passed": bool, "checks": [...]}
    lineage: dict
    trained_tokens: int
    results_csv: bytes


class TrainerStopped(msgspec.Struct, tag="trainer_stopped", array_like=True):
    job_id: str
    status: JobStatus  # paused | cancelled | queued (preempted) | failed
    message: str = ""  # the job's event; for a failure, its error message
    error_code: str | None = None
    error_param: str | None = None


class TrainerAck(msgspec.Struct, tag="trainer_ack", array_like=True):
    job_id: str  # the manager recorded the trainer's last report: it may exit


TrainerReport = TrainerStarted | TrainerEvent | TrainerCheckpoint | TrainerFinished | \
    TrainerStopped
JobMessage = JobCommand | JobState | TrainerHello | TrainerControl | TrainerThreads | TrainerAck \
    | TrainerReport

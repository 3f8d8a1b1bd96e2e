"""/v1/fine_tuning/jobs: the request (OpenAI's fields plus a `peft` extension) and responses."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from openapi.common import INT32, OpenAIBaseModel, StrictModel, Text, unless_none

Auto = Literal["auto"]
# wire.store.ADAPTER_NAME's rule: the contract imports no project code, a test holds them equal
ADAPTER_NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"


LOWEST_PRIORITY, HIGHEST_PRIORITY = -100, 100  # a job's priority (its tenant's tier's too)

class Hyperparameters(StrictModel):
    n_epochs: Auto | Annotated[int, Field(ge=1, le=50)] = "auto"
    batch_size: Auto | Annotated[int, Field(ge=1, le=256)] = "auto"
    learning_rate_multiplier: Auto | Annotated[float, Field(gt=0)] = "auto"


class Supervised(StrictModel):
    hyperparameters: Hyperparameters | None = None


class DpoHyperparameters(Hyperparameters):
    beta: Auto | Annotated[float, Field(gt=0, le=2)] = Field(default="auto", description=(
        "how far the model may move from the reference (the model the job starts from) to "
        "prefer the preferred outputs: higher keeps it closer; auto: 0.1"))


class Dpo(StrictModel):
    hyperparameters: DpoHyperparameters | None = None


class Method(StrictModel):
    type: Literal["supervised", "dpo", "reinforcement"]
    supervised: Supervised | None = None
    dpo: Dpo | None = None
    reinforcement: dict | None = None


class PeftSettings(StrictModel):
    """Extension (sent by the SDK through `extra_body={"peft": {...}}`): the PEFT method."""

    method: Literal["lora", "ia3", "adalora", "prefix_tuning", "prompt_tuning"] = "lora"
    r: int = Field(default=8, ge=1, le=256)
    alpha: int | None = Field(default=None, ge=1, le=INT32, description="default: 2 x r")
    dropout: float = Field(default=0.0, ge=0, lt=1)
    target_modules: list[Text] | None = None
    feedforward_modules: list[Text] | None = None
    num_virtual_tokens: int = Field(default=10, ge=1, le=256)
    max_seq_length: int | None = Field(default=None, ge=8, le=INT32)
    learning_rate: float | None = Field(default=None, gt=0, description="overrides base x mult.")
    warmup_ratio: float = Field(default=0.1, ge=0, lt=1)
    weight_decay: float = Field(default=0.0, ge=0)
    checkpoint_every_steps: int = Field(
        default=0, ge=0, le=INT32,
        description="also save (and serve) a checkpoint every this many steps; 0: per epoch only")
    gradient_checkpointing: bool = Field(default=False, description=(
        "keep only each decoder layer's input and recompute the layer in the backward pass: "
        "a job's activations shrink to a fraction for about a third more compute per step "
        "(not with prefix_tuning)"))


class HeldOutPrompt(StrictModel):
    prompt: Text = Field(min_length=1, max_length=8192)
    completion: Text = Field(min_length=1, max_length=1024,
                             description="the model's greedy completion must start with this")


class Gates(StrictModel):
    """Extension: what a job's result must pass to be put in service; otherwise it is
    registered as a candidate (`in_service: false`) that can be promoted by hand. Losses must
    always be finite."""

    min_loss_drop: float | None = Field(default=None, ge=0, lt=1, description=(
        "the mean training loss over the last quarter of the steps must be at most (1 - this) x "
        "the mean over the first quarter; not checked when absent"))
    validation_vs_base: bool = Field(default=True, description=(
        "with a validation file: its loss must be no worse than the base model's"))
    held_out: list[HeldOutPrompt] = Field(default_factory=list, max_length=16)


class FineTuningJobCreate(OpenAIBaseModel):
    model: Text
    training_file: Text
    validation_file: Text | None = None
    suffix: str | None = Field(default=None, min_length=1, max_length=64,
                               pattern=r"^[A-Za-z0-9_.-]+$")
    seed: int | None = Field(default=None, ge=0, le=2147483647)
    metadata: dict[Text, Text] | None = None
    method: Method | None = None
    hyperparameters: Hyperparameters | None = Field(default=None, description="deprecated")
    integrations: list[dict] | None = Field(default=None, description=(
        "not supported: this deployment reaches no outside service (such as Weights & Biases), "
        "so a non-empty list is refused (400); a job's metrics are its events and result file"))
    peft: PeftSettings | None = None
    gates: Gates | None = None
    priority: int | None = Field(default=None, ge=LOWEST_PRIORITY, le=HIGHEST_PRIORITY,
                                 description=(
        "extension: when every job slot is taken, a queued job preempts the running job of "
        "lowest priority below its own, which checkpoints, is queued again and later resumes; "
        "absent: the tenant's tier's priority (0 unless configured)"))
    register_as: str | None = Field(default=None, pattern=ADAPTER_NAME,
                                    description=(
        "extension: also register the result as the next version of the tenant's adapter of "
        "this name, serving it if the quality gates pass (a candidate version otherwise)"))


class JobError(BaseModel):
    code: str
    message: str
    param: str | None = None


class FineTuningJob(BaseModel):
    model_config = ConfigDict(extra="allow")

    id: str
    object: Literal["fine_tuning.job"] = "fine_tuning.job"
    created_at: int
    error: JobError | None = None
    fine_tuned_model: str | None = None
    finished_at: int | None = None
    hyperparameters: dict
    model: str
    organization_id: str
    result_files: list[str]
    seed: int
    status: Literal["validating_files", "queued", "running", "succeeded", "failed",
                    "cancelled", "paused"]
    trained_tokens: int | None = None
    training_file: str
    validation_file: str | None = None
    metadata: dict[Text, Text] | None = None
    method: dict


class JobList(BaseModel):
    object: Literal["list"] = "list"
    data: list[FineTuningJob]
    has_more: bool


class JobEvent(BaseModel):
    id: str
    object: Literal["fine_tuning.job.event"] = "fine_tuning.job.event"
    created_at: int
    level: Literal["info", "warn", "error"]
    message: str
    type: Literal["message", "metrics"] = "message"
    data: dict | None = unless_none()


class EventList(BaseModel):
    object: Literal["list"] = "list"
    data: list[JobEvent]
    has_more: bool


class Checkpoint(BaseModel):
    model_config = ConfigDict(extra="allow")

    id: str
    object: Literal["fine_tuning.job.checkpoint"] = "fine_tuning.job.checkpoint"
    created_at: int
    fine_tuned_model_checkpoint: str
    fine_tuning_job_id: str
    step_number: int
    metrics: dict


class CheckpointList(BaseModel):
    object: Literal["list"] = "list"
    data: list[Checkpoint]
    first_id: str | None = None
    last_id: str | None = None
    has_more: bool

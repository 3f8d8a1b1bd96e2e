"""A fine-tuning job's settings, with every default resolved once, when the job is created:
what the trainer runs is exactly what was stored (and shown in the job object)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

MIN_EXAMPLES = 10
BASE_LEARNING_RATE = {"lora": 2e-4, "adalora": 2e-4, "ia3": 1e-3, "prefix_tuning": 1e-3,
                      "prompt_tuning": 1e-3}
DEFAULT_MAX_SEQ_LENGTH = 1024


@dataclass(frozen=True)
class PeftSpec:
    """The `peft` block of a job: which PEFT method and its settings."""

    method: str = "lora"
    r: int = 8
    alpha: int = 16
    dropout: float = 0.0
    target_modules: list[str] | None = None
    feedforward_modules: list[str] | None = None
    num_virtual_tokens: int = 10
    max_seq_length: int = DEFAULT_MAX_SEQ_LENGTH
    learning_rate: float = BASE_LEARNING_RATE["lora"]
    warmup_ratio: float = 0.1
    weight_decay: float = 0.0
    checkpoint_every_steps: int = 0  # besides one per epoch; 0: per epoch only
    init_model: str | None = None  # continue training this fine-tuned model or checkpoint...
    init_adapter: str | None = None  # ...whose adapter directory this is
    gates: dict | None = None  # quality gates (openapi.fine_tuning.Gates); None: the defaults
    register_as: str | None = None  # the result is also the next version of this adapter name


@dataclass(frozen=True)
class JobSpec:
    n_epochs: int
    batch_size: int
    learning_rate_multiplier: float
    peft: PeftSpec = field(default_factory=PeftSpec)

    def hyperparameters(self) -> dict:
        """OpenAI's `hyperparameters` object, resolved."""
        return {"n_epochs": self.n_epochs, "batch_size": self.batch_size,
                "learning_rate_multiplier": self.learning_rate_multiplier}

    @classmethod
    def from_stored(cls, hyperparameters: dict, peft: dict) -> JobSpec:
        return cls(int(hyperparameters["n_epochs"]), int(hyperparameters["batch_size"]),
                   float(hyperparameters["learning_rate_multiplier"]), PeftSpec(**peft))

    def peft_dict(self) -> dict:
        return asdict(self.peft)


def resolve(hyperparameters: dict, peft: dict, n_examples: int, max_context: int) -> JobSpec:
    """Replace every "auto" and every missing setting by its value, as OpenAI does when a job
    starts: 3 epochs, a batch of ~2% of the examples (1 to 8), a multiplier of 1; the learning
    rate is the method's base rate times the multiplier unless the `peft` block sets one."""
    n_epochs = hyperparameters.get("n_epochs", "auto")
    batch_size = hyperparameters.get("batch_size", "auto")
    multiplier = hyperparameters.get("learning_rate_multiplier", "auto")
    n_epochs = 3 if n_epochs == "auto" else int(n_epochs)
    batch_size = min(8, max(1, round(n_examples * 0.02))) if batch_size == "auto" \
        else int(batch_size)
    multiplier = 1.0 if multiplier == "auto" else float(multiplier)
    settings = {k: v for k, v in peft.items() if v is not None}
    method = settings.get("method", "lora")
    r = settings.get("r", 8)
    limit = max_context or 2048
    settings.update(
        method=method, r=r, alpha=settings.get("alpha") or 2 * r,
        max_seq_length=min(settings.get("max_seq_length") or DEFAULT_MAX_SEQ_LENGTH, limit),
        learning_rate=settings.get("learning_rate") or BASE_LEARNING_RATE[method] * multiplier)
    return JobSpec(n_epochs, batch_size, multiplier, PeftSpec(**settings))


def too_few_examples(n_examples: int) -> str | None:
    """Why a training file cannot train, if it has too few examples."""
    if n_examples >= MIN_EXAMPLES:
        return None
    return (f"Training file has {n_examples} example(s), but must have at least {MIN_EXAMPLES} "
            "examples")

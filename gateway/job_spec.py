"""A fine-tuning job's settings, with every default resolved once, when the job is created:
what the trainer runs is exactly what was stored (and shown in the job object)."""

from __future__ import annotations

from typing import Literal, Protocol

from catalogue.weight_names import matching
from wire.jobs import ALL_LINEAR, DEFAULT_MAX_SEQ_LENGTH, JobSpec, PeftSpec

__all__ = ["Chosen", "JobSpec", "PeftSpec", "resolve", "too_few_examples", "unknown_target",
           "unsupported"]
MIN_EXAMPLES = 10
DEFAULT_BETA = 0.1  # DPO's, as TRL's and OpenAI's "auto"
BASE_LEARNING_RATE = {"lora": 2e-4, "adalora": 2e-4, "ia3": 1e-3, "prefix_tuning": 1e-3,
                      "prompt_tuning": 1e-3}


class Chosen(Protocol):
    """What a user chose (`openapi.fine_tuning.Hyperparameters`): a value or "auto"."""

    n_epochs: int | Literal["auto"]
    batch_size: int | Literal["auto"]
    learning_rate_multiplier: float | Literal["auto"]


def resolve(chosen: Chosen, peft: dict, n_examples: int, max_context: int,
            beta: float | Literal["auto"] | None = None) -> JobSpec:
    """Replace every "auto" and every missing setting by its value, as OpenAI does when a job
    starts: 3 epochs, a batch of ~2% of the examples (1 to 8), a multiplier of 1; the learning
    rate is the method's base rate times the multiplier unless the `peft` block sets one. A
    `beta` (or "auto": `DEFAULT_BETA`) makes it a DPO job."""
    n_epochs = 3 if chosen.n_epochs == "auto" else chosen.n_epochs
    batch_size = min(8, max(1, round(n_examples * 0.02))) if chosen.batch_size == "auto" \
        else chosen.batch_size
    multiplier = 1.0 if chosen.learning_rate_multiplier == "auto" \
        else float(chosen.learning_rate_multiplier)
    settings = {k: v for k, v in peft.items() if v is not None}
    method = settings.get("method", "lora")
    r = settings.get("r", 8)
    limit = max_context or 2048
    settings.update(
        method=method, r=r, alpha=settings.get("alpha") or 2 * r,
        max_seq_length=min(settings.get("max_seq_length") or DEFAULT_MAX_SEQ_LENGTH, limit),
        learning_rate=settings.get("learning_rate") or BASE_LEARNING_RATE[method] * multiplier)
    return JobSpec(n_epochs, batch_size, multiplier, PeftSpec(**settings),
                   DEFAULT_BETA if beta == "auto" else beta)


def too_few_examples(n_examples: int) -> str | None:
    """Why a training file cannot train, if it has too few examples."""
    if n_examples >= MIN_EXAMPLES:
        return None
    return (f"Training file has {n_examples} example(s), but must have at least {MIN_EXAMPLES} "
            "examples")


def unsupported(spec: JobSpec) -> str | None:
    """Why a resolved spec's settings cannot train together, if they cannot."""
    if spec.peft.gradient_checkpointing and spec.peft.method == "prefix_tuning":
        return ("gradient_checkpointing cannot be used with prefix_tuning: a recomputed layer "
                "would run without the prefix's virtual keys and values")
    return None


def unknown_target(spec: JobSpec, modules: frozenset[str], model: str) -> tuple[str, str] | None:
    """(the field, why) when a module the job targets is none of the model's (`modules`, its
    weight-bearing ones; empty: not known here). peft would skip it if another matched; a job
    that trains less than it names is a typo's doing."""
    for field in ("target_modules", "feedforward_modules"):
        targets = getattr(spec.peft, field) or []
        for target in [] if targets == [ALL_LINEAR] else targets:
            if modules and not matching(modules, target):
                ends = sorted({name.rpartition(".")[2] for name in modules})
                return (f"peft.{field}", f"peft.{field} names '{target}', which is no module "
                        f"of {model} (its modules' names end in: {', '.join(ends)})")
    return None

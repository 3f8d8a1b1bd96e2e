"""How many fine-tuning jobs run at once by default (`--max-jobs 0`): as many as the machine's
cores allow, while their memory fits; and how many torch threads each runs on (`ThreadShare`).

Cores: half of them (at least 2); each trainer computes attention, backward and the optimizer
on a core beside the executor and the inference workers. Memory (`JobBudget`): half of what is
available when the manager starts (the rest stays for inference workers and the executor); a
queued job starts while what the running jobs may take, with its own, fits. What a job may take
at most: its process (`TRAINER_PROCESS_BYTES`, a forked trainer's private memory measured on a
tiny model) plus what a step keeps: a full micro-batch's activations for the backward pass and
its fp32 logits three times over (the logits, their softmax, its gradient), or, where the
executor computes the head's loss (it offers it, the architecture's recipe names the head,
`catalogue.stretches`; the job does not adapt it; privacy is off: `workers.remote.loss`), only
that call's answer (a loss, a right answer and a hidden state's gradient per token; an
evaluation's is smaller still). Activations are counted as
Korthikanti et al. count them ("Reducing Activation Recomputation in Large Transformer Models",
2022: 16-bit values per token, layer and hidden unit; an fp32 tensor of tokens x hidden is 2),
for what a trainer keeps (`workers.training.lean`): per layer the residual stream at both norms'
inputs (4), attention's q, k, v, output and the output projection's input (at most 10), the
MLP's two inner outputs (4 x intermediate / hidden); with LoRA dropout also each adapted layer's
dropped input and mask (2.5 x (6 + intermediate / hidden)). A job that recomputes its layers
keeps each layer's input and one layer's activations at a time. The base weights are not
counted: the executor holds them once for every job. Torch-free: the model's shape comes from
its config.json or the catalogue.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass

import psutil

from catalogue.builtin import BUILTINS
from catalogue.paths import local_path
from catalogue.stretches import RECIPES
from wire.cores import host_cores

log = logging.getLogger("workers.jobs")
TRAINER_PROCESS_BYTES = 768 * 2**20  # API trainers on tiny-llama: 0.73 GiB each (issue 32)
MICRO_BATCH_TOKENS = 4096  # workers.training.loop.Hyperparameters.micro_batch_tokens
MEMORY_SHARE = 0.5


@dataclass(frozen=True)
class Shape:
    hidden: int
    layers: int
    vocab: int
    intermediate: int  # the MLP's inner width
    head: str | None = None  # the head whose loss the executor may compute (None: it cannot)

    @classmethod
    def of(cls, config: dict, model_type: str | None = None) -> Shape:
        hidden = config.get("hidden_size") or config["n_embd"]
        recipe = RECIPES.get(model_type or config.get("model_type", ""))
        return cls(hidden, config.get("num_hidden_layers") or config["n_layer"],
                   config["vocab_size"],
                   config.get("intermediate_size") or config.get("n_inner") or 4 * hidden,
                   recipe.head if recipe is not None else None)


def model_shape(model: str) -> Shape | None:
    """The model's shape from its directory's config.json, else from the catalogue."""
    path = local_path(model)
    try:
        if path is not None:
            return Shape.of(json.loads((path / "config.json").read_text()))
        if model in BUILTINS:
            return Shape.of(BUILTINS[model].config, BUILTINS[model].model_type)
    except (OSError, ValueError, KeyError):
        pass
    return None


def layer_values(shape: Shape, dropout: bool = False) -> float:
    """What one decoder layer keeps for the backward, in 16-bit values per token and hidden
    unit (the module's docstring says of what)."""
    widths = shape.intermediate / shape.hidden
    return 14 + 4 * widths + (2.5 * (6 + widths) if dropout else 0)


def job_bytes(shape: Shape, dtype_bytes: int = 4, *, recompute: bool = False,
              dropout: bool = False, head_loss: bool = False) -> int:
    """The most one job's trainer may take: its process, a full micro-batch's activations (all
    layers', or with `recompute` each layer's input and one layer's), its logits (with
    `head_loss`: the executor's answer instead)."""
    tokens = MICRO_BATCH_TOKENS
    value = tokens * shape.hidden * dtype_bytes // 2  # the paper counts 2-byte values
    layer = layer_values(shape, dropout)
    kept = layer + 2 * shape.layers if recompute else layer * shape.layers
    head = tokens * (shape.hidden + 3) * 4 if head_loss else 3 * tokens * shape.vocab * 4
    return TRAINER_PROCESS_BYTES + int(kept * value) + head


def adapts_head(method: dict, head: str) -> bool:
    """Whether a job's peft settings (`wire.jobs.PeftSpec` as stored) name the output head: its
    trainer then computes the logits itself (peft's "all-linear" leaves the head out)."""
    return head in (method.get("target_modules") or [])


def never() -> bool:
    return False


@dataclass(frozen=True)
class JobBudget:
    """What running jobs may take together; each job counted by `job_bytes` for its model.
    `head_loss`: whether the executor's trainers may use its head loss now (the manager asks)."""

    bytes: int
    shape: Shape
    head_loss: Callable[[], bool] = never

    def cost(self, recompute: bool, dropout: bool = False, head_loss: bool = False) -> int:
        return job_bytes(self.shape, recompute=recompute, dropout=dropout, head_loss=head_loss)

    def cost_of(self, method: dict) -> int:
        """A job's, by its stored peft settings."""
        head = self.shape.head
        return self.cost(bool(method.get("gradient_checkpointing")), bool(method.get("dropout")),
                         head is not None and self.head_loss() and not adapts_head(method, head))


@dataclass(frozen=True)
class ThreadShare:
    """A trainer's (or an inference worker's) torch threads: an operator's fixed count, else the
    cores shared out among the jobs running at once (the live workers). A trainer's own compute
    (attention, backward, optimizer) alternates with the executor's calls for it, so a lone job
    may use every core between its calls; jobs running together get a share each (as plain
    processes sharing the machine would), and as jobs start and end the manager tells running
    trainers their new count (workers: `workers.manager.worker_threads`)."""

    cores: int
    fixed: int = 0  # `ManagerConfig.trainer_threads` or `.worker_threads` (0: shared out)

    def of(self, running: int) -> int:
        return self.fixed or max(1, self.cores // max(1, running))


def default_capacity(model: str, *, cores: int | None = None, available_bytes: int | None = None,
                     head_loss: Callable[[], bool] = never) -> tuple[int, JobBudget | None]:
    """How many jobs at once by the cores, and the memory budget they share (None: the model's
    shape is unknown, and the cores alone decide)."""
    by_cores = max(2, (cores or host_cores()) // 2)
    shape = model_shape(model)
    if shape is None:
        log.info("max_jobs %d (half the cores; the model's shape is unknown)", by_cores)
        return by_cores, None
    available = available_bytes if available_bytes is not None else \
        psutil.virtual_memory().available
    budget = JobBudget(int(available * MEMORY_SHARE), shape, head_loss)
    log.info("max_jobs %d by the cores, while their memory fits in %.1f GiB (half of %.1f GiB "
             "available): %d jobs of up to %.2f GiB, or %d recomputing their layers (%.2f GiB)%s",
             by_cores, budget.bytes / 2**30, available / 2**30,
             budget.bytes // budget.cost(False), budget.cost(False) / 2**30,
             budget.bytes // budget.cost(True), budget.cost(True) / 2**30, _with_head_loss(budget))
    return by_cores, budget


def _with_head_loss(budget: JobBudget) -> str:
    """The log's figures while the executor computes the head's loss, where it can (the
    architecture's recipe names the head)."""
    if budget.shape.head is None:
        return ""
    return (f"; while the executor computes the head's loss "
            f"{budget.cost(False, head_loss=True) / 2**30:.2f} and "
            f"{budget.cost(True, head_loss=True) / 2**30:.2f} GiB")


def job_capacity(max_jobs: int, model: str,
                 head_loss: Callable[[], bool] = never) -> tuple[int, JobBudget | None]:
    """An operator's `--max-jobs` count alone, or by default the cores' count and the memory
    budget."""
    return (max_jobs, None) if max_jobs else default_capacity(model, head_loss=head_loss)

"""How many fine-tuning jobs run at once by default (`--max-jobs 0`): as many as the machine's
cores and its memory allow, whichever is fewer.

Cores: half of them (at least 2); each trainer computes attention, backward and the optimizer
on a core beside the executor and the inference workers. Memory: half of what is available when
the manager starts (the rest stays for inference workers and the executor), divided by what one
job may take at most: its process (`TRAINER_PROCESS_BYTES`, a forked trainer's private memory
measured on a tiny model) plus the activations a full micro-batch keeps for the backward pass
(34 values per token, layer and hidden unit; Korthikanti et al., "Reducing Activation
Recomputation in Large Transformer Models", 2022) and its fp32 logits three times over (the
logits, their softmax, its gradient). The base weights are not counted: the executor holds them
once for every job. Torch-free: the model's shape comes from its config.json or the catalogue.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass

import psutil

from catalogue.builtin import BUILTINS
from catalogue.paths import local_path

log = logging.getLogger("workers.jobs")
TRAINER_PROCESS_BYTES = 768 * 2**20  # API trainers on tiny-llama: 0.73 GiB each (issue 32)
MICRO_BATCH_TOKENS = 4096  # workers.training.loop.Hyperparameters.micro_batch_tokens
MEMORY_SHARE = 0.5


@dataclass(frozen=True)
class Shape:
    hidden: int
    layers: int
    vocab: int

    @classmethod
    def of(cls, config: dict) -> Shape:
        return cls(config.get("hidden_size") or config["n_embd"],
                   config.get("num_hidden_layers") or config["n_layer"], config["vocab_size"])


def model_shape(model: str) -> Shape | None:
    """The model's shape from its directory's config.json, else from the catalogue."""
    path = local_path(model)
    try:
        if path is not None:
            return Shape.of(json.loads((path / "config.json").read_text()))
        if model in BUILTINS:
            return Shape.of(BUILTINS[model].config)
    except (OSError, ValueError, KeyError):
        pass
    return None


def job_bytes(shape: Shape, dtype_bytes: int = 4) -> int:
    """The most one job's trainer may take: its process, a full micro-batch's activations."""
    tokens = MICRO_BATCH_TOKENS
    activations = 34 * tokens * shape.hidden * shape.layers * dtype_bytes // 2
    logits = 3 * tokens * shape.vocab * 4
    return TRAINER_PROCESS_BYTES + activations + logits


def default_max_jobs(model: str, *, cores: int | None = None,
                     available_bytes: int | None = None) -> int:
    by_cores = max(2, (cores or os.cpu_count() or 2) // 2)
    shape = model_shape(model)
    if shape is None:  # an unknown shape: the cores decide
        log.info("max_jobs %d (half the cores; the model's shape is unknown)", by_cores)
        return by_cores
    available = available_bytes if available_bytes is not None else \
        psutil.virtual_memory().available
    each = job_bytes(shape)
    by_memory = int(available * MEMORY_SHARE // each)
    chosen = max(1, min(by_cores, by_memory))
    log.info("max_jobs %d: %d by the cores, %d by memory (%.1f GiB available, up to %.2f GiB "
             "a job)", chosen, by_cores, by_memory, available / 2**30, each / 2**30)
    return chosen

"""A built-in model's checkpoint saved in bfloat16 (once, beside the built-ins in the model cache):
what many published checkpoints are. A process that loads it as float32 converts its own copy,
where the pages of a float32 checkpoint are shared by every process that maps them."""

from __future__ import annotations

import shutil
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from catalogue.paths import model_cache_dir
from catalogue.resolve import resolve_model, write_model_dir


def bfloat16_checkpoint(model: str) -> Path:
    target = model_cache_dir() / f"{model}-bfloat16"
    if (target / "config.json").exists():
        return target
    source = resolve_model(model)

    def write(staging: Path) -> None:
        for item in source.iterdir():  # the tokenizer and generation config as they are
            if not item.name.startswith(("model", "config")) and item.is_file():
                shutil.copy(item, staging / item.name)
        AutoModelForCausalLM.from_pretrained(source, dtype=torch.bfloat16).save_pretrained(staging)

    return write_model_dir(target, write)

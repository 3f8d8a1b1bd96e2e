"""Built-in models, materialized as real Hugging Face model directories.

`resolve_model(name_or_path)` returns a directory that `from_pretrained` loads: a local HF model
directory is used as is; a built-in name is exported once into the model cache and reused.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM
from transformers.utils import logging as hf_logging

from catalogue.builtin import BUILTINS, BuiltinModel
from catalogue.paths import model_cache_dir
from catalogue.tokenizer import CHAT_TOKENS, save_tokenizer

hf_logging.disable_progress_bar()  # per-shard progress bars only clutter service logs


def resolve_model(name_or_path: str | Path) -> Path:
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        if not (path / "config.json").exists():
            raise FileNotFoundError(f"{path} is not a Hugging Face model directory")
        return path.resolve()
    name = str(name_or_path)
    if name not in BUILTINS:
        known = ", ".join(sorted(BUILTINS))
        raise FileNotFoundError(
            f"unknown model {name!r}: not a directory nor a built-in ({known})")
    target = model_cache_dir() / name
    if not (target / "model.safetensors").exists():
        export(name, target)
    return target


def export(name: str, directory: str | Path) -> Path:
    """Write the built-in model `name` to `directory` (atomically: concurrent exports are safe)."""
    spec = BUILTINS[name]
    return write_model_dir(Path(directory), lambda staging: _write(spec, staging))


def write_model_dir(directory: Path, write: Callable[[Path], None]) -> Path:
    """`write` a model directory into a staging directory beside `directory`, then rename it
    into place: a reader never sees half a model, and of concurrent writers one wins."""
    directory.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{directory.name}-", dir=directory.parent))
    try:
        write(staging)
        try:
            staging.rename(directory)
        except OSError:
            if not (directory / "config.json").exists():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return directory


def _write(spec: BuiltinModel, directory: Path) -> None:
    tokenizer = save_tokenizer(directory)
    config = AutoConfig.for_model(spec.model_type, **spec.config)
    config.bos_token_id = tokenizer.bos_token_id
    config.eos_token_id = tokenizer.eos_token_id
    config.pad_token_id = tokenizer.pad_token_id
    config.architectures = None
    torch.manual_seed(spec.seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.generation_config.eos_token_id = [
        tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids(CHAT_TOKENS[1])
    ]
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(directory)

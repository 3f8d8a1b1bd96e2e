"""Trainer checkpoints: the adapter (PEFT format) plus what resuming needs.

DATA_DIR/jobs/<job>/checkpoints/step-<N>/ holds adapter_config.json,
adapter_model.safetensors and trainer_state.pt (optimizer, scheduler, data position, history);
one the job lists also told.json, the report the manager records it by (one saved only because
the job stopped has none). Written to a staging directory and renamed, so a crash never leaves
half a checkpoint. A job's results file is the CSV of its steps' history (`results_csv`).
"""

from __future__ import annotations

import csv
import io
import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import torch
from peft import set_peft_model_state_dict
from safetensors.torch import load_file

STATE = "trainer_state.pt"
TOLD = "told.json"


@dataclass
class Progress:
    epoch: int = 0  # the epoch to continue in
    position: int = 0  # the batch to continue at, within that epoch
    step: int = 0  # optimizer steps done
    trained_tokens: int = 0
    history: list[dict] = field(default_factory=list)  # one row per step (the results CSV)


def checkpoint_root(data_dir: Path, job_id: str) -> Path:
    return data_dir / "jobs" / job_id / "checkpoints"


def name_base(model, base: str) -> None:
    """The saved config names the base model as the API does (peft writes the directory it was
    loaded from: a path on this server, which a tenant reads in the model's lineage)."""
    for config in model.peft_config.values():
        config.base_model_name_or_path = base


def save_adapter(model, directory: Path) -> None:
    """The adapter's own weights only: with an adapter on the head or the embeddings peft would
    also save those base weights, which live in the executor (and never change)."""
    model.save_pretrained(directory, save_embedding_layers=False)


def save(root: Path, model, optimizer, scheduler, progress: Progress,
         told: dict | None = None) -> Path:
    target = root / f"step-{progress.step}"
    staging = root / f".step-{progress.step}.tmp"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    save_adapter(model, staging)
    torch.save({"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
                "progress": progress.__dict__}, staging / STATE)
    if told is not None:
        (staging / TOLD).write_text(json.dumps(told))
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)
    return target


def saved(root: Path) -> list[Path]:
    """The whole checkpoints under `root` (a crash leaves only whole ones), oldest first."""
    found = [p for p in root.glob("step-*") if (p / STATE).exists()]
    return sorted(found, key=lambda p: int(p.name.split("-")[1]))


def latest(root: Path) -> Path | None:
    found = saved(root)
    return found[-1] if found else None


def saved_at(root: Path, step: int) -> bool:
    return (root / f"step-{step}" / STATE).exists()


def told(root: Path) -> list[tuple[Path, dict]]:
    """The listed checkpoints on disk, oldest first, each with its report (step, epoch,
    metrics): a resuming trainer tells them again, as a crash may have come between a save and
    the manager's record of it."""
    return [(p, json.loads((p / TOLD).read_text())) for p in saved(root) if (p / TOLD).exists()]


def restore(path: Path, model, optimizer, scheduler) -> Progress:
    set_peft_model_state_dict(model, load_file(path / "adapter_model.safetensors"))
    state = torch.load(path / STATE, weights_only=True, map_location="cpu")
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    return Progress(**state["progress"])


def results_csv(history: list[dict]) -> bytes:
    out = io.StringIO()
    columns = ["step", "train_loss", "train_accuracy", "valid_loss", "valid_mean_token_accuracy"]
    writer = csv.DictWriter(out, fieldnames=columns, extrasaction="ignore")
    writer.writeheader()
    for row in history:
        writer.writerow({k: row.get(k, "") for k in columns})
    return out.getvalue().encode()

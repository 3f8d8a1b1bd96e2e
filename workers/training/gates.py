"""Quality gates: what a finished job's adapter must pass to be put in service.

Losses must be finite; with `min_loss_drop`, the mean training loss over the last quarter of the
steps at most (1 - min_loss_drop) x the mean over the first quarter (one step's loss is one
batch's: comparing single steps would judge the batches, not the training); with a validation
file (and `validation_vs_base`), its loss no worse than the base model's on the same file; and
each held-out prompt's greedy completion must start with the expected text.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from workers.training.loop import evaluate

MAX_HELD_OUT_TOKENS = 256
DEFAULTS = {"min_loss_drop": None, "validation_vs_base": True, "held_out": []}


def base_loss(model, valid: list, pad: int, micro_batch_tokens: int) -> float:
    """The base model's validation loss: the adapter disabled."""
    with model.disable_adapter():
        return evaluate(model, valid, pad, micro_batch_tokens)[0]


def check(model, tokenizer, history: list[dict], valid: list, pad: int, micro_batch_tokens: int,
          config: dict | None, base: Callable[..., float] = base_loss,
          named: str = "base model") -> dict:
    """{"passed": bool, "checks": [{"name", "passed", "detail"}]}; `base`: the `named` model's
    validation loss, as `base_loss` (the job's objective's)."""
    config = {**DEFAULTS, **(config or {})}
    losses = [h["train_loss"] for h in history]
    valid_losses = [h["valid_loss"] for h in history if "valid_loss" in h]
    finite = all(math.isfinite(x) for x in losses + valid_losses)
    checks = [{"name": "finite_losses", "passed": finite,
               "detail": "all losses finite" if finite else "a loss was NaN or infinite"}]
    if config["min_loss_drop"] is not None:
        checks.append(_loss_fell(losses, config["min_loss_drop"], finite))
    model.eval()
    if valid and valid_losses and config["validation_vs_base"]:
        reference = base(model, valid, pad, micro_batch_tokens)
        ours = valid_losses[-1]
        checks.append({"name": "validation_vs_base",
                       "passed": finite and ours <= reference + 1e-6,
                       "detail": f"validation loss {ours:.4f}, {named} {reference:.4f}"})
    for number, item in enumerate(config["held_out"], start=1):
        completion = _greedy(model, tokenizer, item["prompt"], item["completion"])
        checks.append({"name": f"held_out_{number}",
                       "passed": completion.startswith(item["completion"]),
                       "detail": f"expected {item['completion']!r}, got {completion!r}"})
    return {"passed": all(c["passed"] for c in checks), "checks": checks}


def _loss_fell(losses: list[float], min_drop: float, finite: bool) -> dict:
    window = max(1, len(losses) // 4)
    first = sum(losses[:window]) / window if losses else math.nan
    last = sum(losses[-window:]) / window if losses else math.nan
    target = (1 - min_drop) * first
    return {"name": "training_loss_fell", "passed": finite and last <= target,
            "detail": f"mean of the first {window} step(s) {first:.4f}, of the last {last:.4f}, "
                      f"at most {target:.4f} needed"}


@torch.no_grad()
def _greedy(model, tokenizer, prompt: str, expected: str) -> str:
    ids = torch.tensor([tokenizer.encode(prompt)])
    budget = min(len(tokenizer.encode(expected)) + 2, MAX_HELD_OUT_TOKENS)
    out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
                         max_new_tokens=budget, pad_token_id=tokenizer.eos_token_id)
    return tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True)

"""One optimizer step over a batch, with gradient accumulation; evaluation; the optimizer.

A batch runs in micro-batches of examples of like lengths (`micro_batches`), none of more than
`micro_batch_tokens` padded positions; the loss is the sum of token losses divided by the token
count of the whole batch, so accumulated gradients equal those of the batch in one piece.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers import get_linear_schedule_with_warmup

from wire.jobs import JobSpec
from workers.remote.loss import head_loss
from workers.training.data import IGNORE, Example, collate

FULL_ROWS = 256  # a micro-batch of these many tokens runs the executor's products near their best
MAX_PADDING = 0.1  # of a micro-batch's tokens, past FULL_ROWS: a longer example starts the next


@dataclass(frozen=True)
class Hyperparameters:
    n_epochs: int
    batch_size: int
    learning_rate: float
    warmup_ratio: float = 0.1
    weight_decay: float = 0.0
    micro_batch_tokens: int = 4096
    max_grad_norm: float = 1.0

    @classmethod
    def of(cls, spec: JobSpec) -> Hyperparameters:
        """The loop's view of a job's spec (the loop also runs without a job: tests, bench)."""
        return cls(spec.n_epochs, spec.batch_size, spec.peft.learning_rate,
                   spec.peft.warmup_ratio, spec.peft.weight_decay)


@dataclass
class StepResult:
    loss: float
    accuracy: float
    tokens: int  # tokens processed (all positions, not only trained ones)


def optimizer_for(model: torch.nn.Module, hp: Hyperparameters, total_steps: int):
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=hp.learning_rate, weight_decay=hp.weight_decay)
    warmup = round(hp.warmup_ratio * total_steps)
    return optimizer, get_linear_schedule_with_warmup(optimizer, warmup, total_steps)


def micro_batches(examples: list[Example], max_tokens: int) -> list[list[Example]]:
    """A step's examples in micro-batches of at most `max_tokens` padded positions, by length
    (the step's gradient is their sum, in any order), each example joining the one before while
    that holds under `FULL_ROWS` tokens or the padding stays within `MAX_PADDING` of them: GSM8K's
    chat examples, 4 a step in file order, were 27 % padding, which every layer computed."""
    groups: list[list[Example]] = [[]]
    for example in sorted(examples, key=lambda e: len(e.ids)):
        group = groups[-1]
        real = sum(len(e.ids) for e in group)
        padded = len(example.ids) * (len(group) + 1)  # the longest so far: sorted
        wasteful = padded > (1 + MAX_PADDING) * (real + len(example.ids))
        if group and (padded > max_tokens or (real >= FULL_ROWS and wasteful)):
            groups.append([example])
        else:
            group.append(example)
    return groups


def token_losses(model: torch.nn.Module, batch: dict[str, torch.Tensor]):
    """(the token losses' sum, the labels trained, the right answers): through the executor's
    head loss where the model has one (`workers.remote.loss`), else from the logits."""
    batch = {name: t.to(model.device) for name, t in batch.items()}
    fused = head_loss(model)
    with fused.passing(batch["labels"]) if fused is not None else contextlib.nullcontext():
        out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
    length = batch["input_ids"].shape[1]
    logits = out.logits[:, -length:, :]  # prompt tuning prepends virtual tokens
    if fused is not None:  # the "logits" are the final hidden states
        return fused(logits[:, :-1, :], batch["labels"][:, 1:])
    logits, labels = logits[:, :-1, :].float(), batch["labels"][:, 1:]
    token_loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1),
                                 ignore_index=IGNORE, reduction="sum")
    mask = labels != IGNORE
    correct = ((logits.argmax(-1) == labels) & mask).sum()
    return token_loss, int(mask.sum()), int(correct)


def train_step(model: torch.nn.Module, examples: list[Example], pad_id: int, optimizer,
               scheduler, hp: Hyperparameters,
               on_gradients: Callable[[], None] | None = None) -> StepResult:
    """One optimizer step; `on_gradients` runs after it, before gradients are cleared."""
    total = sum(sum(1 for label in e.labels[1:] if label != IGNORE) for e in examples)
    loss_sum = correct = tokens = 0
    for group in micro_batches(examples, hp.micro_batch_tokens):
        batch = collate(group, pad_id)
        token_loss, _, right = token_losses(model, batch)
        (token_loss / total).backward()
        loss_sum += float(token_loss.detach())
        correct += right
        tokens += int(batch["attention_mask"].sum())
    apply_gradients(model, optimizer, scheduler, hp, on_gradients)
    return StepResult(loss_sum / total, correct / total, tokens)


def apply_gradients(model: torch.nn.Module, optimizer, scheduler, hp: Hyperparameters,
                    on_gradients: Callable[[], None] | None = None) -> None:
    """The step's accumulated gradients clipped and applied; `on_gradients` runs after, before
    they are cleared."""
    if hp.max_grad_norm:
        torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad],
                                       hp.max_grad_norm)
    optimizer.step()
    scheduler.step()
    if on_gradients is not None:
        on_gradients()
    optimizer.zero_grad(set_to_none=True)


@torch.no_grad()
def evaluate(model: torch.nn.Module, examples: list[Example], pad_id: int,
             micro_batch_tokens: int) -> tuple[float, float]:
    """(mean token loss, token accuracy) over `examples`."""
    loss_sum = count = correct = 0
    for group in micro_batches(examples, micro_batch_tokens):
        token_loss, n, right = token_losses(model, collate(group, pad_id))
        loss_sum += float(token_loss)
        count += n
        correct += right
    return (loss_sum / count, correct / count) if count else (math.nan, math.nan)

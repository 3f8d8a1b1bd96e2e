"""Direct preference optimization (DPO; Rafailov et al., 2023), OpenAI's `method: "dpo"`: from
pairs of outputs to one conversation, the adapter learns to prefer the preferred one more than
the reference model does. The reference is the model the job starts from (the base model with a
new adapter, which LoRA and IA3 leave as it is, or the fine-tuned model a job continues, as DPO
after supervised fine-tuning wants it): each output's log-probability under it is computed once,
without gradients, before the first step (and again as a job resumes, before its checkpoint is
restored), so a step runs the policy alone. A pair's loss is -log sigmoid(beta x ((log
p(preferred) - log p_ref(preferred)) - (log p(non-preferred) - log p_ref(non-preferred)))), each
log-probability summed over the output's tokens; a step's loss is the mean over its pairs. Its
"accuracy": the share of pairs whose preferred output the model favours more than the reference
does (a positive margin).

Each output's log-probability is the sum of its tokens' losses (negated) that the executor's head
loss answers row by row where the trainer has it: the logits never cross the link, as in a
supervised step, and each row's gradient comes back with its loss. A pair's shared prompt runs
once for both outputs (`workers.training.shared_prompt`)."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch
import torch.nn.functional as F

from workers.remote.loss import head_loss
from workers.training import shared_prompt
from workers.training.data import IGNORE, Items, Pair
from workers.training.gates import base_loss
from workers.training.loop import (
    Hyperparameters,
    StepResult,
    apply_gradients,
    evaluate,
    train_step,
)


@dataclass(frozen=True)
class Objective:
    """What a job's steps and evaluations optimize: the token loss of its examples, or DPO's
    loss of its pairs."""

    step: Callable[..., StepResult]  # (model, items, pad, optimizer, scheduler, hp, on_grads)
    evaluate: Callable[..., tuple[float, float]]  # (model, items, pad, micro_batch_tokens)
    base: Callable[..., float]  # the `reference` model's evaluated loss, the same arguments
    prepare: Callable[..., None] | None  # (model, items, pad, micro_batch_tokens, between)
    reference: str = "base model"  # the model whose loss `base` gives


def objective(beta: float | None) -> Objective:
    if beta is None:
        return Objective(train_step, evaluate, base_loss, None)
    return Objective(partial(preference_step, beta=beta), partial(evaluate_pairs, beta=beta),
                     _reference_loss, remember_references, "starting model")


def _reference_loss(*_: object) -> float:
    """The starting model's DPO loss: it is the reference, every margin 0, every loss log 2."""
    return math.log(2)


def pair_groups(pairs: list[Pair], max_tokens: int,
                how: str | None = None) -> list[list[Pair]]:
    """Pairs in micro-batches of at most `max_tokens` padded positions, by length, as they run
    in `shared_prompt` layout `how` (None: both outputs of each pair whole)."""
    groups: list[list[Pair]] = [[]]
    widest = (0, 0)  # the group's longest row run once, and run for each output
    for pair in sorted(pairs, key=_longest):
        shape = shared_prompt.shape(pair, how)
        once, each = max(widest[0], shape[0]), max(widest[1], shape[1])
        if groups[-1] and (len(groups[-1]) + 1) * (once + 2 * each) > max_tokens:
            groups.append([])
            once, each = shape
        groups[-1].append(pair)
        widest = (once, each)
    return [group for group in groups if group]


def micro_batches(model: torch.nn.Module, pairs: list[Pair], max_tokens: int,
                  share_prompt: bool = True) -> tuple[str | None, list[list[Pair]]]:
    """(the layout the pairs run in, in `model`; `pair_groups` in it)."""
    how = shared_prompt.layout(model, pairs) if share_prompt and pairs else None
    return how, pair_groups(pairs, max_tokens, how)


def _longest(pair: Pair) -> int:
    return max(pair.preferred.size, pair.non_preferred.size)


def sequence_logps(model: torch.nn.Module, group: list[Pair], pad_id: int,
                   how: str | None) -> torch.Tensor:
    """[2 x pairs]: each output's log-probability, summed over its tokens; the preferred first.
    Through the executor's head loss where the model has one (`workers.remote.loss`: only the
    labelled positions' rows cross the link, their logits stay in the executor), else from the
    logits (only the labelled positions' are normalized: a prompt's are never copied). A pair's
    prompt runs once, in `how`'s layout (`workers.training.shared_prompt`, as `micro_batches`
    chose it), or with None each output whole, as plain peft's DPO runs them."""
    fused = head_loss(model)
    passing = fused.passing if fused is not None else _no_head_loss
    outputs, labels, owners = shared_prompt.run(model, group, pad_id, passing, how)
    if fused is not None:  # the "logits" are the final hidden states
        losses, trained = fused.row_losses(outputs, labels)
        picked = -losses
    else:
        trained = labels != IGNORE
        rows = outputs[trained].float()
        picked = rows.gather(1, labels[trained].unsqueeze(1)).squeeze(1) - rows.logsumexp(-1)
    return torch.zeros(2 * len(group), dtype=picked.dtype, device=picked.device).index_add(
        0, owners[trained], picked)


def _no_head_loss(labels: torch.Tensor | None) -> contextlib.AbstractContextManager:
    return contextlib.nullcontext()


@torch.no_grad()
def remember_references(model: torch.nn.Module, pairs: Items, pad_id: int,
                        micro_batch_tokens: int,
                        between: Callable[[], None] | None = None) -> None:
    """Each pair's outputs' log-probabilities under the model as it is now (the reference),
    kept with the pair; `between` runs after each micro-batch (and may raise to stop)."""
    training = model.training
    model.eval()
    try:
        how, groups = micro_batches(model, pairs, micro_batch_tokens)
        for group in groups:
            logps = sequence_logps(model, group, pad_id, how).cpu()
            for k, pair in enumerate(group):
                pair.reference = (float(logps[k]), float(logps[len(group) + k]))
            if between is not None:
                between()
    finally:
        model.train(training)


def pair_losses(model: torch.nn.Module, group: list[Pair], pad_id: int, beta: float,
                how: str | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(each pair's loss, each pair's margin: the policy's log-ratio of preferred over
    non-preferred minus the reference's)."""
    policy = sequence_logps(model, group, pad_id, how)
    n = len(group)
    reference = torch.tensor([p.reference[0] - p.reference[1] for p in group],
                             dtype=policy.dtype, device=policy.device)
    margin = policy[:n] - policy[n:] - reference
    return -F.logsigmoid(beta * margin), margin.detach()


def preference_step(model: torch.nn.Module, pairs: list[Pair], pad_id: int, optimizer,
                    scheduler, hp: Hyperparameters,
                    on_gradients: Callable[[], None] | None = None, *,
                    beta: float, share_prompt: bool = True) -> StepResult:
    """One optimizer step of DPO over the pairs (the mean of their losses)."""
    loss_sum = favoured = tokens = 0.0
    how, groups = micro_batches(model, pairs, hp.micro_batch_tokens, share_prompt)
    for group in groups:
        losses, margin = pair_losses(model, group, pad_id, beta, how)
        (losses.sum() / len(pairs)).backward()
        loss_sum += float(losses.detach().sum())
        favoured += int((margin > 0).sum())
        tokens += sum(pair.size for pair in group)
    apply_gradients(model, optimizer, scheduler, hp, on_gradients)
    return StepResult(loss_sum / len(pairs), favoured / len(pairs), int(tokens))


@torch.no_grad()
def evaluate_pairs(model: torch.nn.Module, pairs: list[Pair], pad_id: int,
                   micro_batch_tokens: int, *, beta: float) -> tuple[float, float]:
    """(mean DPO loss, share of pairs favoured) over `pairs`; the reference's is (log 2, 0)."""
    loss_sum = favoured = 0.0
    how, groups = micro_batches(model, pairs, micro_batch_tokens)
    for group in groups:
        losses, margin = pair_losses(model, group, pad_id, beta, how)
        loss_sum += float(losses.sum())
        favoured += int((margin > 0).sum())
    return (loss_sum / len(pairs), favoured / len(pairs)) if pairs else (float("nan"),) * 2

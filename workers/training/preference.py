"""Direct preference optimization (DPO; Rafailov et al., 2023), OpenAI's `method: "dpo"`: from
pairs of outputs to one conversation, the adapter learns to prefer the preferred one more than
the reference model does. The reference is the base model (the adapter disabled), as TRL takes
it for a PEFT model, computed beside each micro-batch without gradients. A pair's loss is
-log sigmoid(beta x ((log p(preferred) - log p_ref(preferred)) - (log p(non-preferred) -
log p_ref(non-preferred)))), each log-probability summed over the output's tokens; a step's loss
is the mean over its pairs. Its "accuracy": the share of pairs whose preferred output the
adapter favours more than the reference does (a positive margin).

The log-probabilities need each row's logits: the model's output head answers with them here
(the executor's fused head loss sums a whole batch's token losses, not each sequence's)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch
import torch.nn.functional as F

from workers.training.data import IGNORE, Pair, collate
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
    base: Callable[..., float]  # the base model's evaluated loss, the same arguments


def objective(beta: float | None) -> Objective:
    if beta is None:
        return Objective(train_step, evaluate, base_loss)
    return Objective(partial(preference_step, beta=beta), partial(evaluate_pairs, beta=beta),
                     _reference_loss)


def _reference_loss(*_: object) -> float:
    """The base model's DPO loss: it is the reference, every margin 0, every loss log 2."""
    return math.log(2)


def pair_groups(pairs: list[Pair], max_tokens: int) -> list[list[Pair]]:
    """A step's pairs in micro-batches of at most `max_tokens` padded positions (both outputs of
    each pair run in one), by length."""
    groups: list[list[Pair]] = [[]]
    for pair in sorted(pairs, key=_longest):
        if groups[-1] and 2 * (len(groups[-1]) + 1) * _longest(pair) > max_tokens:
            groups.append([])
        groups[-1].append(pair)
    return groups


def _longest(pair: Pair) -> int:
    return max(pair.preferred.size, pair.non_preferred.size)


def sequence_logps(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """[rows]: each row's log-probability of its labelled tokens, summed (only the labelled
    positions' logits are normalized: a prompt's are never copied)."""
    batch = {name: t.to(model.device) for name, t in batch.items()}
    out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
    length = batch["input_ids"].shape[1]
    labels = batch["labels"][:, 1:]
    trained = labels != IGNORE
    rows = out.logits[:, -length:, :][:, :-1, :][trained].float()  # prompt tuning prepends
    picked = rows.gather(1, labels[trained].unsqueeze(1)).squeeze(1) - rows.logsumexp(-1)
    owner = trained.nonzero()[:, 0]  # each trained row's sequence
    return torch.zeros(len(labels), dtype=picked.dtype, device=picked.device).index_add(
        0, owner, picked)


def pair_losses(model: torch.nn.Module, group: list[Pair], pad_id: int,
                beta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(each pair's loss, each pair's margin: the policy's log-ratio of preferred over
    non-preferred minus the reference's)."""
    batch = collate([p.preferred for p in group] + [p.non_preferred for p in group], pad_id)
    with torch.no_grad(), model.disable_adapter():
        reference = sequence_logps(model, batch)
    policy = sequence_logps(model, batch)
    n = len(group)
    margin = (policy[:n] - reference[:n]) - (policy[n:] - reference[n:])
    return -F.logsigmoid(beta * margin), margin.detach()


def preference_step(model: torch.nn.Module, pairs: list[Pair], pad_id: int, optimizer,
                    scheduler, hp: Hyperparameters,
                    on_gradients: Callable[[], None] | None = None, *,
                    beta: float) -> StepResult:
    """One optimizer step of DPO over the pairs (the mean of their losses)."""
    loss_sum = favoured = tokens = 0.0
    for group in pair_groups(pairs, hp.micro_batch_tokens):
        losses, margin = pair_losses(model, group, pad_id, beta)
        (losses.sum() / len(pairs)).backward()
        loss_sum += float(losses.detach().sum())
        favoured += int((margin > 0).sum())
        tokens += sum(pair.size for pair in group)
    apply_gradients(model, optimizer, scheduler, hp, on_gradients)
    return StepResult(loss_sum / len(pairs), favoured / len(pairs), int(tokens))


@torch.no_grad()
def evaluate_pairs(model: torch.nn.Module, pairs: list[Pair], pad_id: int,
                   micro_batch_tokens: int, *, beta: float) -> tuple[float, float]:
    """(mean DPO loss, share of pairs favoured) over `pairs`; the base model's is (log 2, 0)."""
    loss_sum = favoured = 0.0
    for group in pair_groups(pairs, micro_batch_tokens):
        losses, margin = pair_losses(model, group, pad_id, beta)
        loss_sum += float(losses.sum())
        favoured += int((margin > 0).sum())
    return (loss_sum / len(pairs), favoured / len(pairs)) if pairs else (float("nan"),) * 2

"""Both outputs of a DPO pair continue one conversation: the positions they share run once, and
each output runs on from their keys and values.

Run whole, a pair computes its prompt twice (on GSM8K's one-question pairs a fifth of a step's
positions, in a multi-turn chat most of them); here a micro-batch makes two forwards: the pairs'
shared positions but the last before either output's first trained token, keeping their keys and
values (transformers' cache, with autograd: the backward of both outputs reaches the prompt's
once), then both outputs of every pair from that last shared position on (its output predicts
the first trained token), each at the positions it has in the whole sequence and attending to
its prompt's keys and values as the whole sequence's would.

Not where an adapter prepends virtual tokens (prompt and prefix tuning: a cache and positions of
their own), where decoder layers are recomputed in the backward (the cache would be filled
again), or where a sliding window may be shorter than the cache (twice the longest conversation:
its mask counts the cache's places, and a shorter prompt's padding sits among them)."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager

import torch
from torch import nn

from workers.training.data import IGNORE, Example, Pair, collate

Passing = Callable[[torch.Tensor | None], AbstractContextManager]  # the head loss's `passing`


def shared_length(pair: Pair) -> int:
    """How many positions both outputs run once: their common beginning, short of the position
    just before either's first trained token (its output predicts that token: the outputs run
    from there on)."""
    a, b = pair.preferred, pair.non_preferred
    limit = min(_first_trained(a), _first_trained(b)) - 1
    n = 0
    while n < limit and a.ids[n] == b.ids[n]:
        n += 1
    return n


def _first_trained(example: Example) -> int:
    return next((t for t, label in enumerate(example.labels) if label != IGNORE),
                len(example.ids))


def shares(model: nn.Module, group: list[Pair]) -> bool:
    """Whether `group` may run its prompts once in `model`."""
    peft = getattr(model, "active_peft_config", None)
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    window = getattr(base.config.get_text_config(), "sliding_window", None)
    longest = max(max(p.preferred.size, p.non_preferred.size) for p in group)
    return (peft is None or not peft.is_prompt_learning) \
        and not any(getattr(m, "gradient_checkpointing", False) for m in base.modules()) \
        and (window is None or window > 2 * longest) \
        and all(shared_length(pair) > 0 for pair in group)


def run(model: nn.Module, group: list[Pair], pad_id: int,
        passing: Passing) -> tuple[torch.Tensor, torch.Tensor]:
    """(each output's model outputs at its positions from its prompt's last on, but its own last
    [2 x pairs, length, ...]: logits, or the final hidden states inside `passing`; the tokens
    they predict, IGNORE where none is trained [2 x pairs, length]); the preferred first."""
    cuts = [shared_length(pair) for pair in group]
    outputs = [pair.preferred for pair in group] + [pair.non_preferred for pair in group]
    prompts = _on(model, collate([Example(p.preferred.ids[:c], [IGNORE] * c)
                                  for p, c in zip(group, cuts, strict=True)], pad_id))
    rest = _on(model, collate([Example(e.ids[c:], e.labels[c:])
                               for e, c in zip(outputs, cuts * 2, strict=True)], pad_id))
    with passing(None):  # no head: only the prompts' keys and values are wanted
        cache = model(input_ids=prompts["input_ids"], attention_mask=prompts["attention_mask"],
                      use_cache=True, logits_to_keep=1).past_key_values
    device = prompts["input_ids"].device
    cache.reorder_cache(torch.arange(len(group), device=device).repeat(2))
    start = torch.tensor(cuts * 2, device=device)[:, None]
    longest = max(len(e.ids) for e in outputs)  # a padding row's position stays in range
    positions = (start + torch.arange(rest["input_ids"].shape[1], device=device)).clamp(
        max=longest - 1)
    mask = torch.cat([prompts["attention_mask"].repeat(2, 1), rest["attention_mask"]], 1)
    with passing(rest["labels"]):
        out = model(input_ids=rest["input_ids"], attention_mask=mask, position_ids=positions,
                    past_key_values=cache, use_cache=True)
    return out.logits[:, :-1], rest["labels"][:, 1:]


def _on(model: nn.Module, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {name: t.to(model.device) for name, t in batch.items()}

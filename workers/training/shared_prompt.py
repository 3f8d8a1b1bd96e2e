"""Both outputs of a DPO pair continue one conversation: the positions they share run once, and
each output runs on from them.

Run whole, a pair computes its prompt twice (on GSM8K's one-question pairs a fifth of a step's
padded positions, in a multi-turn chat most of them). Here the positions both outputs share,
but the last before either output's first trained token (`shared_length`), run once, and each
output runs from that last shared token on (its output predicts the first trained token), at
the positions it has in the whole sequence and attending to its prompt as the whole sequence
would; the backward of both outputs reaches the prompt's once. Two layouts:

- packed (attention by torch's SDPA, rows up to `PACKED_WIDTH`): one row a pair, the prompt,
  then the preferred output, then the non-preferred, in one forward whose attention mask lets
  each output see the prompt and itself only (a custom 4D mask, which transformers passes on as
  it is). One forward of full-size products, no padding between the two outputs;
- cached (otherwise): the prompts in one forward that keeps their keys and values
  (transformers' cache, with autograd), then both outputs of every pair from there, the cache
  tiled for them.

Not at all where an adapter prepends virtual tokens (prompt and prefix tuning: positions and a
cache of their own) or where a sliding window may be shorter than a row (twice the longest
conversation: its mask counts places, not positions); not cached where decoder layers are
recomputed in the backward (the cache would be filled again) or where a pair shares nothing
(no prompt to cache; packed, its two outputs lie side by side in its row, each from position
0). There each output runs whole, its prompt with it (`run` with no layout)."""

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


PACKED_WIDTH = 4096  # a packed row's positions at most: its mask is this squared, in booleans
PACKED, CACHED = "packed", "cached"


def layout(model: nn.Module, group: list[Pair]) -> str | None:
    """How `group` runs in `model`: `PACKED`, `CACHED`, or None (each output whole)."""
    peft = getattr(model, "active_peft_config", None)
    base = _base(model)
    window = getattr(base.config.get_text_config(), "sliding_window", None)
    longest = max(max(p.preferred.size, p.non_preferred.size) for p in group)
    if (peft is not None and peft.is_prompt_learning) \
            or (window is not None and window <= 2 * longest):
        return None
    if base.config._attn_implementation == "sdpa" \
            and max(packed_length(pair) for pair in group) <= PACKED_WIDTH:
        return PACKED  # a pair that shares nothing packs too: its outputs side by side
    recomputed = any(getattr(m, "gradient_checkpointing", False) for m in base.modules())
    nothing = any(shared_length(pair) == 0 for pair in group)  # no prompt to cache
    return None if recomputed or nothing else CACHED


def packed_length(pair: Pair) -> int:
    return pair.preferred.size + pair.non_preferred.size - shared_length(pair)


def shape(pair: Pair, how: str | None) -> tuple[int, int]:
    """(the positions of the pair's row run once, those run for each output) in layout `how`;
    a micro-batch's rows are padded to the longest of each."""
    longest = max(pair.preferred.size, pair.non_preferred.size)
    if how == PACKED:
        return packed_length(pair), 0
    cut = shared_length(pair) if how == CACHED else 0
    return cut, longest - cut


Ran = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # (outputs, labels, owners)


def run(model: nn.Module, group: list[Pair], pad_id: int, passing: Passing,
        how: str | None) -> Ran:
    """(the model's outputs at every position but each row's last [rows, length, ...]: logits, or
    the final hidden states inside `passing`; the tokens they predict, IGNORE where none is
    trained [rows, length]; the output each position serves [rows, length]: pair i's preferred
    i, its non-preferred pairs + i), in layout `how` (None: each output whole)."""
    ways = {PACKED: _packed, CACHED: _cached, None: _whole}
    return ways[how](model, group, pad_id, passing)


def _whole(model: nn.Module, group: list[Pair], pad_id: int, passing: Passing) -> Ran:
    batch = _on(model, collate([p.preferred for p in group] + [p.non_preferred for p in group],
                               pad_id))
    length = batch["input_ids"].shape[1]
    with passing(batch["labels"]):
        out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
    labels = batch["labels"][:, 1:]
    return out.logits[:, -length:, :][:, :-1, :], labels, _rows(labels)  # prompt tuning
    # prepends virtual tokens


def _packed(model: nn.Module, group: list[Pair], pad_id: int, passing: Passing) -> Ran:
    n, width = len(group), max(packed_length(pair) for pair in group)
    ids = torch.full((n, width), pad_id, dtype=torch.long)
    labels = torch.full((n, width), IGNORE, dtype=torch.long)
    positions = torch.zeros((n, width), dtype=torch.long)
    part = torch.full((n, width), -1, dtype=torch.long)  # 0 the prompt, 1 and 2 the outputs
    for row, pair in enumerate(group):
        cut, a, b = shared_length(pair), pair.preferred, pair.non_preferred
        ends = (cut, a.size, a.size + b.size - cut)
        ids[row, :ends[2]] = torch.tensor(a.ids + b.ids[cut:])
        labels[row, cut + 1:ends[1]] = torch.tensor(a.labels[cut + 1:])
        labels[row, ends[1] + 1:ends[2]] = torch.tensor(b.labels[cut + 1:])
        positions[row, :ends[2]] = torch.cat([torch.arange(a.size), torch.arange(cut, b.size)])
        for k, (begin, end) in enumerate(zip((0, *ends[:2]), ends, strict=True)):
            part[row, begin:end] = k
    query, key = part[:, :, None], part[:, None, :]
    seen = (key >= 0) & ((key == 0) | (key == query)) \
        & torch.ones(width, width, dtype=torch.bool).tril()
    seen |= torch.eye(width, dtype=torch.bool)  # a padding row sees itself: no empty softmax
    ids, labels, positions, seen = (t.to(model.device) for t in (ids, labels, positions, seen))
    with passing(labels):
        out = model(input_ids=ids, attention_mask=seen[:, None], position_ids=positions)
    owner = torch.arange(n, device=ids.device)[:, None] + n * (part.to(ids.device) == 2)
    return out.logits[:, :-1], labels[:, 1:], owner[:, :-1]


def _cached(model: nn.Module, group: list[Pair], pad_id: int, passing: Passing) -> Ran:
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
    labels = rest["labels"][:, 1:]
    return out.logits[:, :-1], labels, _rows(labels)


def _rows(labels: torch.Tensor) -> torch.Tensor:
    """Each position's output where each row is one output."""
    return torch.arange(len(labels), device=labels.device)[:, None].expand_as(labels)


def _base(model: nn.Module) -> nn.Module:
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def _on(model: nn.Module, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {name: t.to(model.device) for name, t in batch.items()}

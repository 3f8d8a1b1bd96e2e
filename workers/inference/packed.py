"""A chunk of a long prompt and the running rows' decode step in one forward (a packed step).

A prompt coming in by chunks (`chunks.py`) had a forward of its own each step beside the
running rows' decode step: the fixed part of a forward (every weight read once, through every
executor call) twice a step. Here the step's input is one sequence: each running row's next
token, then the chunk's tokens, with their own position ids; every weight-bearing layer sees
all of them in one call. Only attention tells them apart: each layer's keys and values are
split as they are appended (`PackedCache`), the rows' into the batch's cache and the chunk's
into the prompt's own, and the rows attend by runs over theirs (`row_attention.attend`, the
mask built from the batch's) while the chunk attends causally over its prompt so far. The
head computes the rows' logits and the chunk's last only (`logits_to_keep`).

Each position goes through its own row's adapter (`rows.py`, positions as rows). Packing takes
attention that `row_attention.install` took over (sdpa), a resident batch, and no adapter's
module on the head where rows of several adapters mix; else the two forwards run as before.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from workers.inference.batch import BatchCache
from workers.inference.chunks import Partial
from workers.inference.prefill import Prefilled
from workers.inference.request import Request
from workers.inference.rooms import cache_tensors
from workers.inference.row_attention import Group
from workers.inference.rows import RowAdapters


@dataclass
class Packed:
    """One packed step's parts, read by each layer's attention (`Packed.attend`)."""
    rows: int  # the running rows, first in the packed sequence
    mask: torch.Tensor  # [rows, time] the batch's, this step's token included
    positions: torch.Tensor  # [rows, 1] each row's position this step
    groups: tuple[Group, ...]  # the rows' runs (`row_attention.plan`)
    done: int  # the chunk's prompt tokens already in its cache
    chunk: int  # the chunk's tokens this step
    chunk_kv: dict[int, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)

    def rows_mask(self, window: int | None) -> torch.Tensor:
        """[rows, 1, 1, time]: each row's real positions (within the layer's sliding window)."""
        keep = self.mask.bool()
        if window:
            held = self.mask.cumsum(1) - 1  # each key's position in its row
            keep = keep & (held > self.positions - window)
        return keep[:, None, None, :]

    def chunk_mask(self, window: int | None, device: torch.device) -> torch.Tensor:
        """[1, 1, chunk, done + chunk]: causal from the chunk's first position on."""
        query = torch.arange(self.done, self.done + self.chunk, device=device)[:, None]
        key = torch.arange(self.done + self.chunk, device=device)[None, :]
        keep = key <= query
        if window:
            keep = keep & (key > query - window)
        return keep[None, None]

    def attend(self, module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
               value: torch.Tensor, attend_rows: Any, **kwargs: Any) -> tuple[torch.Tensor, None]:
        """query [1, heads, rows + chunk, dim]; `key`/`value` the batch's (the chunk's were
        kept as they were appended): [1, rows + chunk, heads, dim], as sdpa's attention
        returns it. `attend_rows`: the rows' attention by runs (`row_attention.attend`)."""
        window = kwargs.get("sliding_window")
        own, _ = attend_rows(module, _as_rows(query[:, :, :self.rows]), key, value,
                             self.rows_mask(window), row_groups=self.groups, **kwargs)
        chunk_keys, chunk_values = self.chunk_kv[module.layer_idx]
        chunk, _ = sdpa_attention_forward(module, query[:, :, self.rows:], chunk_keys,
                                          chunk_values, self.chunk_mask(window, query.device),
                                          **kwargs)
        return torch.cat([own.transpose(0, 1), chunk], dim=1), None


class PackedCache:
    """The batch's cache, each layer's update split: the first `packed.rows` positions (one
    token a row) go to the batch, the rest to the chunk's prompt cache (kept for attention)."""

    def __init__(self, batch: Any, chunk: Any, packed: Packed) -> None:
        self._batch, self._chunk, self._packed = batch, chunk, packed

    def update(self, keys: torch.Tensor, values: torch.Tensor, layer_idx: int,
               cache_kwargs: dict | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        rows = self._packed.rows
        self._packed.chunk_kv[layer_idx] = self._chunk.update(
            keys[:, :, rows:], values[:, :, rows:], layer_idx, cache_kwargs)
        return self._batch.update(_as_rows(keys[:, :, :rows]), _as_rows(values[:, :, :rows]),
                                  layer_idx, cache_kwargs)

    def __getattr__(self, name: str) -> Any:  # what the model asks of a cache: the batch's
        return getattr(self._batch, name)


def packs(request: Request, sequences: list, rows: RowAdapters) -> bool:
    """Whether the request's chunk may share the forward of the rows of `sequences` (where
    attention goes by rows): each position goes through its own row's adapter, unless an
    adapter's module wraps the head, which sees the kept positions only (one adapter for all
    then, or none to choose)."""
    adapters = {request.adapter, *(s.request.adapter for s in sequences)}
    one = len(adapters) == 1 and None not in adapters  # made the active one: peft's own path
    return bool(sequences) and (rows.model is None or one or not rows.tunes_head())


def step_forward(model: Any, rows: RowAdapters, batch: BatchCache, groups: tuple[Group, ...],
                 packed: tuple[Partial, int] | None,
                 device: torch.device) -> tuple[torch.Tensor, Prefilled | None]:
    """A decode step's forward over the batch's rows, runs `groups`, with the chunk `packed`
    if any: the rows' logits [rows, vocab] on the host, and the chunk's prompt's prefill once
    it is all in (else None)."""
    cache, mask, positions = batch.step_inputs()
    tokens = [seq.last for seq in batch.sequences]
    adapters = [s.request.adapter for s in batch.sequences]
    if packed is None:
        with rows.select(adapters):
            return model(input_ids=torch.tensor([[t] for t in tokens], device=device),
                         attention_mask=mask, position_ids=positions, past_key_values=cache,
                         use_cache=True, **({"row_groups": groups} if groups else {})
                         ).logits[:, -1].cpu(), None
    partial, take = packed
    prompt, count = partial.request.prompt_ids, len(tokens)
    end = min(len(prompt), partial.done + take)
    parts = Packed(count, mask, positions, groups, partial.done, end - partial.done)
    keep = torch.arange(count + (end == len(prompt)), device=device)
    keep[count:] = count + end - partial.done - 1  # the prompt's last position, once all in
    with rows.select(adapters + [partial.request.adapter] * (end - partial.done),
                     by_position=True):
        out = model(input_ids=torch.tensor([tokens + prompt[partial.done:end]], device=device),
                    position_ids=torch.cat([positions.view(1, count), torch.arange(
                        partial.done, end, device=device).view(1, -1)], 1),
                    past_key_values=PackedCache(cache, partial.cache, parts), use_cache=True,
                    logits_to_keep=keep, packed=parts)
    logits = out.logits[0].cpu()
    partial.done = end
    if partial.rest:
        return logits, None
    kv = cache_tensors(partial.cache)
    return logits[:count], Prefilled(kv, torch.ones(1, kv[0][0].shape[2], dtype=torch.long,
                                                    device=device), logits[count])


def _as_rows(t: torch.Tensor) -> torch.Tensor:
    """[1, heads, n, dim] -> [n, heads, 1, dim]: one position of each of n rows."""
    return t.permute(2, 1, 0, 3)

"""Prompts' chunks and the running rows' decode step in one forward (a packed step).

A prompt coming in by chunks (`chunks.py`), or a short one arriving while rows decode, had a forward
of its own beside the running rows' decode step: the fixed part of a forward (every weight read
once, through every executor call) twice a step. Here the step's input is one sequence: each running
row's next token, then each chunk's tokens, with their own position ids; every weight-bearing layer
sees all of them in one call, in the executor's decode lane like any decode step's (`decode_step`:
by its rows alone it would be taken for a prefill). Only attention tells them apart: each layer's
keys and values are split as they are appended (`PackedCache`), the rows' into the batch's cache and
each chunk's into its prompt's own, and the rows attend by runs over theirs
(`row_attention.attend`, the mask built from the batch's) while each chunk attends causally
over its prompt so far. The head computes the rows' logits and each finished prompt's last.

Each position goes through its own row's adapter (`rows.py`, positions as rows). Packing takes
attention that `row_attention.install` took over (sdpa), a resident batch, and no adapter's
module on the head where rows of several adapters mix; else the two forwards run as before.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
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
from workers.remote.handle import decode_step


@dataclass
class Segment:
    """A prompt's chunk in a packed step: `count` tokens after the `done` in its cache."""
    partial: Partial
    done: int
    count: int
    kv: dict[int, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)
    masks: dict[int | None, torch.Tensor] = field(default_factory=dict)  # by sliding window

    @property
    def ends(self) -> bool:
        """Whether the prompt is all in after this chunk."""
        return self.done + self.count == len(self.partial.request.prompt_ids)

    def mask(self, window: int | None, device: torch.device) -> torch.Tensor:
        """[1, 1, count, done + count]: causal from the chunk's first position on (made once a
        step for each window)."""
        if window not in self.masks:
            query = torch.arange(self.done, self.done + self.count, device=device)[:, None]
            key = torch.arange(self.done + self.count, device=device)[None, :]
            keep = key <= query
            if window:
                keep = keep & (key > query - window)
            self.masks[window] = keep[None, None]
        return self.masks[window]

    def rewind(self) -> None:
        """Take back what a failed forward appended to the prompt's cache."""
        cache = self.partial.cache
        if not self.done:
            self.partial.cache = type(cache)()
            return
        for layer in cache.layers:
            layer.keys, layer.values = layer.keys[:, :, :self.done], layer.values[:, :, :self.done]


@dataclass
class Packed:
    """One packed step's parts, read by each layer's attention (`Packed.attend`)."""
    rows: int  # the running rows, first in the packed sequence
    mask: torch.Tensor  # [rows, time] the batch's, this step's token included
    positions: torch.Tensor  # [rows, 1] each row's position this step
    groups: tuple[Group, ...]  # the rows' runs (`row_attention.plan`)
    segments: list[Segment]  # the chunks after them, in order
    masks: dict[int | None, torch.Tensor] = field(default_factory=dict)  # by sliding window

    def rows_mask(self, window: int | None) -> torch.Tensor:
        """[rows, 1, 1, time]: each row's real positions (within the layer's sliding window;
        made once a step for each window)."""
        if window not in self.masks:
            keep = self.mask.bool()
            if window:
                held = self.mask.cumsum(1) - 1  # each key's position in its row
                keep = keep & (held > self.positions - window)
            self.masks[window] = keep[:, None, None, :]
        return self.masks[window]

    @cached_property
    def spans(self) -> list[tuple[Segment, slice]]:
        """Each chunk's positions in the packed sequence (read by every layer)."""
        spans, start = [], self.rows
        for segment in self.segments:
            spans.append((segment, slice(start, start + segment.count)))
            start += segment.count
        return spans

    def attend(self, module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
               value: torch.Tensor, attend_rows: Any, **kwargs: Any) -> tuple[torch.Tensor, None]:
        """query [1, heads, positions, dim]; `key`/`value` the batch's (each chunk's were kept
        as they were appended): [1, positions, heads, dim], as sdpa's attention returns it.
        `attend_rows`: the rows' attention by runs (`row_attention.attend`)."""
        window = kwargs.get("sliding_window")
        own, _ = attend_rows(module, _as_rows(query[:, :, :self.rows]), key, value,
                             self.rows_mask(window), row_groups=self.groups, **kwargs)
        parts = [own.transpose(0, 1)]
        for segment, span in self.spans:
            keys, values = segment.kv[module.layer_idx]
            parts.append(sdpa_attention_forward(module, query[:, :, span], keys, values,
                                                segment.mask(window, query.device), **kwargs)[0])
        return torch.cat(parts, dim=1), None


class PackedCache:
    """The batch's cache, each layer's update split: the first `packed.rows` positions (one
    token a row) go to the batch, each chunk's to its prompt's cache (kept for attention)."""

    def __init__(self, batch: Any, packed: Packed) -> None:
        self._batch, self._packed = batch, packed

    def update(self, keys: torch.Tensor, values: torch.Tensor, layer_idx: int,
               cache_kwargs: dict | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        for segment, span in self._packed.spans:
            segment.kv[layer_idx] = segment.partial.cache.update(
                keys[:, :, span], values[:, :, span], layer_idx, cache_kwargs)
        rows = self._packed.rows
        return self._batch.update(_as_rows(keys[:, :, :rows]), _as_rows(values[:, :, :rows]),
                                  layer_idx, cache_kwargs)

    def __getattr__(self, name: str) -> Any:  # what the model asks of a cache: the batch's
        return getattr(self._batch, name)


def may_pack(sequences: list, rows: RowAdapters) -> bool:
    """Whether a step may pack prompts of any adapter into the forward of `sequences`' rows."""
    return bool(sequences) and (rows.model is None or not rows.tunes_head())


def packs(request: Request, sequences: list, rows: RowAdapters) -> bool:
    """Whether the request's chunk may share the forward of the rows of `sequences` (where
    attention goes by rows): each position goes through its own row's adapter, unless an
    adapter's module wraps the head, which sees the kept positions only (one adapter for all
    then, or none to choose)."""
    adapters = {request.adapter, *(s.request.adapter for s in sequences)}
    one = len(adapters) == 1 and None not in adapters  # made the active one: peft's own path
    return bool(sequences) and (rows.model is None or one or not rows.tunes_head())


@decode_step()
def step_forward(model: Any, rows: RowAdapters, batch: BatchCache, groups: tuple[Group, ...],
                 chunks: list[tuple[Partial, int]],
                 device: torch.device) -> tuple[torch.Tensor, list[Prefilled | None]]:
    """A decode step's forward over the batch's rows, runs `groups`, with `chunks` (prompts
    and their tokens this step) packed after them: the rows' logits [rows, vocab] on the host,
    and each chunk's prompt's prefill once it is all in (else None). Its executor calls are
    marked a decode step's (`decode_step`). A failure takes the step back
    (`BatchCache.undo_step`, each chunk's cache) before it raises."""
    cache, mask, positions = batch.step_inputs()
    tokens = [seq.last for seq in batch.sequences]
    adapters = [s.request.adapter for s in batch.sequences]
    if not chunks:
        with rows.select(adapters):
            return model(input_ids=torch.tensor([[t] for t in tokens], device=device),
                         attention_mask=mask, position_ids=positions, past_key_values=cache,
                         use_cache=True, **({"row_groups": groups} if groups else {})
                         ).logits[:, -1].cpu(), []
    segments = [Segment(p, p.done, min(p.rest, take)) for p, take in chunks]
    packed = Packed(len(tokens), mask, positions, groups, segments)
    ids, where, keep = list(tokens), [positions.view(1, -1)], list(range(len(tokens)))
    try:
        for segment, span in packed.spans:
            ids += segment.partial.request.prompt_ids[segment.done:segment.done + segment.count]
            adapters += [segment.partial.request.adapter] * segment.count
            where.append(torch.arange(segment.done, segment.done + segment.count,
                                      device=device).view(1, -1))
            keep += [span.stop - 1] if segment.ends else []
        with rows.select(adapters, by_position=True):
            out = model(input_ids=torch.tensor([ids], device=device),
                        position_ids=torch.cat(where, 1),
                        past_key_values=PackedCache(cache, packed), use_cache=True,
                        logits_to_keep=torch.tensor(keep, device=device), packed=packed)
        logits = out.logits[0].cpu()
    except Exception:
        batch.undo_step()
        for segment in segments:
            segment.rewind()
        raise
    done, kept = [], len(tokens)
    for segment in segments:
        segment.partial.done += segment.count
        if not segment.ends:
            done.append(None)
            continue
        kv = cache_tensors(segment.partial.cache)
        done.append(Prefilled(kv, torch.ones(1, kv[0][0].shape[2], dtype=torch.long,
                                             device=device), logits[kept]))
        kept += 1
    return logits[:len(tokens)], done


def _as_rows(t: torch.Tensor) -> torch.Tensor:
    """[1, heads, n, dim] -> [n, heads, 1, dim]: one position of each of n rows."""
    return t.permute(2, 1, 0, 3)

"""Decode attention over each row's own positions, not the whole padded width of the batch.

A running batch's rows are left-padded to its longest (`batch.py`): with sdpa as transformers
runs it, every decode step reads the keys and values of every row over that whole width, the
masked padding included. Beside one 1,024-token row, 7 rows of 100 tokens read 9x what they hold
(llama-160m in-process on 2 cores: a step of those 8 rows took 148 ms, 109 ms reading each row
from its first real position). Here a decode step's rows are split into runs of neighbouring
rows (`plan`), each attending from the first position any of its rows holds; a run costs one
attention call more, counted as `CALL_BYTES` of keys and values read, so rows of like lengths
share a call and a batch without padding keeps one. Each run is transformers' own sdpa over a
view of the cache (no copy), its mask sliced alike, so sliding windows and grouped heads hold.

`install` has a model's attention take a step's plan (`row_groups=`) and otherwise run sdpa as
before; models whose attention is not sdpa (e.g. eager, for soft caps) are left as they are.
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Any

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

NAME = "symbiosis_rows"
# one more attention call costs about what reading this many bytes of keys and values does: on a
# CPU measured (an sdpa call's fixed part ~20 us; a position of llama-160m, 6 KiB a layer,
# ~0.5 us; 2 cores); on a GPU estimated, not measured (a call's ~30 us of launches at ~2 TB/s):
# there rows split only beside padding of tens of thousands of positions
CALL_BYTES = 256 * 1024
GPU_CALL_BYTES = 64 * 2**20

Group = tuple[int, int, int]  # rows [first, end) attend from position `start` on


def install(model: Any) -> bool:
    """Whether `model` (a transformers model, not a PEFT wrapper) now takes `row_groups`: it
    does where its attention was sdpa."""
    AttentionInterface.register(NAME, attend)
    AttentionMaskInterface.register(NAME, sdpa_mask)
    if model.config._attn_implementation == "sdpa":
        model.set_attn_implementation(NAME)
    return model.config._attn_implementation == NAME


def call_bytes(device: torch.device) -> int:
    return CALL_BYTES if device.type == "cpu" else GPU_CALL_BYTES


@lru_cache(maxsize=256)
def plan(starts: tuple[int, ...], call_positions: int) -> tuple[Group, ...]:
    """Rows with `starts` leading padding positions split into runs of neighbours, each reading
    from the smallest start among its rows: the split that reads the fewest positions, a run
    counting `call_positions` more. Empty where one run from position 0 is best."""
    # cost of the rows before `end`, less what every plan reads alike (rows x width)
    best, cut = [0.0] + [math.inf] * len(starts), [0] * (len(starts) + 1)
    for end in range(1, len(starts) + 1):
        low = math.inf
        for first in range(end - 1, -1, -1):
            low = min(low, starts[first])
            cost = best[first] + call_positions - (end - first) * low
            if cost < best[end]:
                best[end], cut[end] = cost, first
    groups: list[Group] = []
    end = len(starts)
    while end:
        first = cut[end]
        groups.append((first, end, min(starts[first:end])))
        end = first
    groups.reverse()
    return () if groups == [(0, len(starts), 0)] else tuple(groups)


def attend(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
           attention_mask: torch.Tensor | None, *, row_groups: tuple[Group, ...] = (),
           packed: Any = None, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """sdpa, run per group of rows from its start where a decode step's `row_groups` apply:
    one query a row and a mask of one row each over exactly the keys' positions. A packed
    step (`packed.Packed`) attends its rows so and its chunk over the chunk's prompt."""
    if packed is not None:
        return packed.attend(module, query, key, value, attend, **kwargs)
    if not row_groups or query.shape[2] != 1 or attention_mask is None \
            or attention_mask.shape[0] != query.shape[0] \
            or attention_mask.shape[-1] != key.shape[2]:
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    parts = [sdpa_attention_forward(module, query[first:end], key[first:end, :, start:],
                                    value[first:end, :, start:],
                                    attention_mask[first:end, ..., start:], **kwargs)[0]
             for first, end, start in row_groups]
    return torch.cat(parts), None


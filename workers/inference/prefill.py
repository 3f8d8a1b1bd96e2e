"""Prefill forwards: one request's prompt, or several requests' prompts in one forward.

Requests admitted together share one forward: their prompts left-padded to the longest, the
padding masked and every row's positions counted from its first real token, so that each row's
keys, values and last logits are its own prompt's (equal to a forward of it alone up to the
summation order of a wider batch). A burst of n requests then costs the executor one call per
base layer instead of n. Each row's cache keeps its padding, zeroed, as the decode batch pads.
Only prompts of similar lengths share a forward (`groups`): padding is computed like prompt.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from peft import PeftModel
from transformers import DynamicCache

from workers.inference.rooms import KV, cache_tensors
from workers.inference.rows import RowAdapters
from workers.remote.handle import ExecutorUnavailable

if TYPE_CHECKING:
    from workers.inference.request import Request

log = logging.getLogger("workers.engine")


@dataclass
class Prefilled:
    kv: KV  # this row's keys and values, [1, heads, width, head_dim] per layer
    mask: torch.Tensor  # [1, width]: 0 over the left padding
    last_logits: torch.Tensor  # [vocab], on the host: sampling runs there (same seeds, draws)
    logits: torch.Tensor | None = None  # [prompt, vocab] on the host, when asked for


PADDING_SHARE = 0.25  # at most this much of a shared forward's tokens may be padding


def groups(lengths: list[int]) -> list[list[int]]:
    """The prompts (by index) that share a forward, longest first: each group grows while its
    padding stays within PADDING_SHARE of its tokens; a group of one goes alone."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    out: list[list[int]] = []
    for i in order:
        group = out[-1] if out else None
        if group and (len(group) + 1) * lengths[group[0]] * (1 - PADDING_SHARE) <= \
                sum(lengths[j] for j in group) + lengths[i]:
            group.append(i)
        else:
            out.append([i])
    return out


def shares_forwards(model: Any) -> bool:
    """Whether prompts may share a forward: not through virtual tokens (prompt or prefix
    tuning), whose PeftModel places them per forward, not per row."""
    return not (isinstance(model, PeftModel) and model.active_peft_config.is_prompt_learning)


def prefill_one(model: Any, rows: RowAdapters, prompt: list[int], adapter: str | None,
                device: torch.device, all_logits: bool) -> Prefilled:
    ids = torch.tensor([prompt], device=device)
    with rows.select([adapter]):
        out = model(input_ids=ids, attention_mask=torch.ones_like(ids),
                    past_key_values=DynamicCache(), use_cache=True,
                    logits_to_keep=0 if all_logits else 1)
    kv = cache_tensors(out.past_key_values)  # prefix tuning's virtual tokens included
    return Prefilled(kv, torch.ones(1, kv[0][0].shape[2], dtype=torch.long, device=device),
                     out.logits[0, -1].cpu(),
                     out.logits[0, -len(prompt):].cpu() if all_logits else None)


def prefill_shared(model: Any, rows: RowAdapters, requests: list[Request],
                   device: torch.device,
                   timed: Callable[[float, int], None] = lambda seconds, tokens: None,
                   ) -> dict[int, Prefilled]:
    """The requests (by id()) prefilled in shared forwards, one per group of similar lengths,
    each forward's time and tokens (padding counted) told to `timed`; a group whose forward
    fails is left out (each of its requests then goes alone, so that a failure stays its
    request's), as are groups of one."""
    shared: dict[int, Prefilled] = {}
    for group in groups([len(r.prompt_ids) for r in requests]):
        if len(group) < 2:
            continue
        members = [requests[i] for i in group]
        began = time.perf_counter()
        try:
            filled = prefill_together(model, rows, [r.prompt_ids for r in members],
                                      [r.adapter for r in members], device)
            timed(time.perf_counter() - began, len(members) * len(members[0].prompt_ids))
        except ExecutorUnavailable:
            raise
        except Exception:
            log.exception("a prefill of %d requests failed: each goes alone", len(members))
            continue
        shared |= {id(r): done for r, done in zip(members, filled, strict=True)}
    return shared


def left_padded(prompts: list[list[int]], device: torch.device
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The prompts' ids left-padded to the longest, the mask (0 over the padding) and each
    row's positions counted from its first real token."""
    width = max(len(p) for p in prompts)  # one tensor of them all, not three ops a row
    ids = torch.tensor([[0] * (width - len(p)) + list(p) for p in prompts], dtype=torch.long)
    lengths = torch.tensor([len(p) for p in prompts])
    mask = (torch.arange(width) >= width - lengths[:, None]).long()
    ids, mask = ids.to(device), mask.to(device)
    return ids, mask, (mask.cumsum(-1) - 1).clamp(min=0)


def prefill_together(model: Any, rows: RowAdapters, prompts: list[list[int]],
                     adapters: list[str | None], device: torch.device) -> list[Prefilled]:
    """One forward for several prompts; each row's cache, mask and last logits."""
    ids, mask, positions = left_padded(prompts, device)
    with rows.select(adapters):
        out = model(input_ids=ids, attention_mask=mask, position_ids=positions,
                    past_key_values=DynamicCache(), use_cache=True, logits_to_keep=1)
    kv = cache_tensors(out.past_key_values)
    padding = (mask == 0)[:, None, :, None].to(kv[0][0].device)  # zeroed once, NaN or not
    kv = [(k.masked_fill(padding, 0), v.masked_fill(padding, 0)) for k, v in kv]
    last = out.logits[:, -1].cpu()
    return [Prefilled([(k[row:row + 1], v[row:row + 1]) for k, v in kv], mask[row:row + 1],
                      last[row]) for row in range(len(prompts))]

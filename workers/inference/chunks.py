"""Long prompts prefilled a chunk a step beside running sequences (chunked prefill).

A prompt prefilled whole holds every running sequence of its engine for as long as its forward
takes (a 2,000-token prompt of llama-160m: over a second on a 2-core host, some 40 decode steps),
so their streams stall. While sequences are running, a prompt longer than a step's chunk is
instead prefilled a chunk a step, its cache growing between the running sequences' decode steps;
it joins them with its first token once the whole prompt is in.

A forward costs a fixed part (every weight read once, what a decode step of a few rows costs)
plus a part per token, so chunks are not free: a prompt in chunks of 16 tokens took 3.1x its
whole prefill on that host, in chunks of 128 1.1x. Where it can, the engine runs a step's chunk
in the running rows' decode forward (`packed.py`), which pays the fixed part once for both; a
step the prompt takes still adds a decode step to its first token. `ChunkBudget` sizes a chunk
from what the engine measures: its tokens cost AMORTIZED times a decode step (the fixed part
then adds at most 1 / AMORTIZED to the prompt's prefill), or less where a running request asks
an inter-token target (what the target leaves after a decode step and, unless the step packs
it, the chunk's own fixed part); never fewer than MIN_TOKENS a step, so that a prompt always
gets in. Until a long enough forward has been measured, UNMEASURED_TOKENS a step, or
MIN_TOKENS where a running request asks an inter-token target (which nothing measured can
check; a tiny model's prefills may never take long enough to measure).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import DynamicCache

from workers.inference.prefill import Prefilled
from workers.inference.request import Request
from workers.inference.rooms import RoomyCache, cache_tensors
from workers.inference.rows import RowAdapters

MIN_TOKENS = 16
LEARN_TOKENS = 64  # the fewest prompt tokens of a forward that says what a token costs
UNMEASURED_TOKENS = 256
AMORTIZED = 3  # a chunk's tokens cost this many decode steps (the fixed part of a forward)
SMOOTHING = 0.25  # of each new measurement in the running estimates


class ChunkBudget:
    """How many prompt tokens a step may prefill beside running sequences: a fixed number, or
    (`fixed` 0) from the measured time of a decode step (taken as a forward's fixed part) and
    of a prompt token beyond it."""

    def __init__(self, fixed: int = 0) -> None:
        self.fixed = fixed
        self.decode_s = 0.0  # a decode step of the running sequences
        self.token_costs: dict[int, float] = {}  # a prompt token beyond a forward's fixed part,
        # by the threads its forward ran on (a long prompt's whole prefill runs on more threads
        # than a chunk step: `workers.threads`)

    @property
    def token_s(self) -> float:
        """A prompt token's cost on the fewest threads measured (the highest): a chunk is sized
        before its step's threads are known, and a cost measured on more (a long prompt's whole
        prefill) would size it too large for a step on fewer."""
        return self.token_costs[min(self.token_costs)] if self.token_costs else 0.0

    def observe_decode(self, seconds: float) -> None:
        self.decode_s = _smoothed(self.decode_s, seconds)

    def observe_prefill(self, seconds: float, tokens: int, threads: int = 0) -> None:
        """A prefill forward of `tokens` prompt tokens on `threads` (0: torch's now, which the
        forward just ran on); one of fewer than LEARN_TOKENS, or that took less than two decode
        steps, says too little about its tokens against its fixed part (a prefill's own is more
        than a decode step's)."""
        if tokens >= LEARN_TOKENS and self.decode_s and seconds > 2 * self.decode_s:
            threads = threads or torch.get_num_threads()
            self.token_costs[threads] = _smoothed(self.token_costs.get(threads, 0.0),
                                                  (seconds - self.decode_s) / tokens)

    def tokens(self, inter_token_us: int = 0, packed: bool = False) -> int:
        """A step's prompt tokens beside running sequences whose tightest inter-token target is
        `inter_token_us` (0: none asked); `packed`: in their decode forward (no forward of the
        chunks' own, whose fixed part the target must leave room for)."""
        if self.fixed:
            return self.fixed
        if not (self.decode_s and self.token_s):  # a target then cannot be checked: the least
            return MIN_TOKENS if inter_token_us else UNMEASURED_TOKENS
        seconds = AMORTIZED * self.decode_s
        if inter_token_us:
            seconds = min(seconds, inter_token_us / 1e6 - (1 if packed else 2) * self.decode_s)
        return max(MIN_TOKENS, int(seconds / self.token_s))


def chunkable(request: Request) -> bool:
    """Whether a request's prompt may come in by chunks: not one that asks its prompt's
    logprobs (echo), nor one of prompt or prefix tuning, whose virtual tokens the PEFT model puts
    in front of each forward."""
    return not request.params.echo and request.prefill is None


@dataclass
class Partial:
    """A request whose prompt is coming in by chunks: its cache so far."""
    request: Request
    cache: DynamicCache = field(default_factory=RoomyCache)
    done: int = 0  # prompt tokens in the cache

    @property
    def rest(self) -> int:
        return len(self.request.prompt_ids) - self.done


class Chunker:
    """An engine's prompts coming in by chunks, first come first."""

    def __init__(self, fixed: int = 0) -> None:
        self.budget = ChunkBudget(fixed)
        self.partials: list[Partial] = []

    @property
    def requests(self) -> list[Request]:
        return [p.request for p in self.partials]

    def plan(self, admitted: deque[Request], running: list[Request],
             packs: bool = False) -> list[tuple[Partial, int]]:
        """This step's chunks: while sequences run or prompts come in by chunks, the admitted
        requests whose prompts are longer than the step's budget join the partials (taken out
        of `admitted`), and each partial takes what is left of the budget (the first at least
        MIN_TOKENS), until it is spent. Where the step `packs` its chunks into the running rows'
        forward, admitted prompts that fit in what is left come in as chunks too, whole."""
        if not (running or self.partials):
            return []
        budget = self.budget.tokens(min((r.token_targets.inter_token_us for r in running
                                         if r.token_targets.inter_token_us), default=0), packs)
        for request in [r for r in admitted if len(r.prompt_ids) > budget and chunkable(r)]:
            admitted.remove(request)
            self.partials.append(Partial(request))
        chunks: list[tuple[Partial, int]] = []
        left = max(budget, MIN_TOKENS)
        for partial in self.partials:
            if left <= 0:
                break
            take = min(partial.rest, left)
            chunks.append((partial, take))
            left -= take
        for request in [r for r in admitted if packs and running and chunkable(r)]:
            if len(request.prompt_ids) > left:
                break
            admitted.remove(request)
            self.partials.append(Partial(request))
            chunks.append((self.partials[-1], len(request.prompt_ids)))
            left -= len(request.prompt_ids)
        return chunks

    def drop(self, request_ids: Collection[str]) -> None:
        self.partials = [p for p in self.partials if p.request.id not in request_ids]


def prefill_chunk(model: Any, rows: RowAdapters, partial: Partial, tokens: int,
                  device: torch.device) -> Prefilled | None:
    """Prefill the next `tokens` of the partial's prompt onto its cache; the whole prompt's
    cache and last logits once it is all in, else None."""
    prompt = partial.request.prompt_ids
    end = min(len(prompt), partial.done + tokens)
    ids = torch.tensor([prompt[partial.done:end]], device=device)
    with rows.select([partial.request.adapter]):
        out = model(input_ids=ids, attention_mask=torch.ones(1, end, dtype=torch.long,
                                                             device=device),
                    past_key_values=partial.cache, use_cache=True, logits_to_keep=1)
    partial.done = end
    if partial.rest:
        return None
    kv = cache_tensors(partial.cache)
    return Prefilled(kv, torch.ones(1, kv[0][0].shape[2], dtype=torch.long, device=device),
                     out.logits[0, -1].cpu())


def _smoothed(estimate: float, measured: float) -> float:
    return measured if not estimate else estimate + SMOOTHING * (measured - estimate)

"""Token choice per sequence: penalties, temperature, top-k, top-p, seeded sampling, logprobs."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from wire.call.digits import greedy_choices
from wire.manager import SamplingParams


@dataclass
class Choice:
    token: int
    logprob: float | None = None
    top: list[tuple[int, float]] | None = None


def make_generator(params: SamplingParams, index: int) -> torch.Generator | None:
    if params.seed is None:
        return None
    generator = torch.Generator()
    generator.manual_seed((params.seed * 1009 + index) % 2**64)  # any int64 seed, any index
    return generator


def argmax_only(params: SamplingParams, counts: dict[int, int], allow_eos: bool,
                eos_ids: tuple[int, ...], grammar: bool) -> bool:
    """Whether `choose` would return the row's argmax and nothing more (greedy; no bias,
    penalty, suppressed end of sequence, grammar or logprobs): a decode step's rows of this
    kind share one argmax over the batch."""
    return (params.temperature <= 0 and not params.logit_bias and params.logprobs is None
            and not (counts and (params.presence_penalty or params.frequency_penalty))
            and (allow_eos or not eos_ids) and not grammar)


def choose(logits: torch.Tensor, params: SamplingParams, counts: dict[int, int],
           generator: torch.Generator | None, allow_eos: bool,
           eos_ids: tuple[int, ...], allowed: torch.Tensor | None = None) -> Choice:
    """Pick the next token from one row of logits [vocab]; `allowed` (bool [vocab]) is a
    grammar's mask. Logprobs are the model's own, before bias, penalties and masks."""
    raw = logits.float()
    scores = raw.clone()
    if params.logit_bias:
        ids = torch.tensor(list(params.logit_bias), dtype=torch.long)
        scores[ids] += torch.tensor(list(params.logit_bias.values()), dtype=scores.dtype)
    if counts and (params.presence_penalty or params.frequency_penalty):
        ids = torch.tensor(list(counts), dtype=torch.long)
        n = torch.tensor(list(counts.values()), dtype=scores.dtype)
        scores[ids] -= params.presence_penalty + params.frequency_penalty * n
    if not allow_eos and eos_ids:
        scores[list(eos_ids)] = float("-inf")
    if allowed is not None:
        scores[~allowed] = float("-inf")
    if params.temperature <= 0:
        token = int(greedy_choices(scores[None])[0])
    else:
        scaled = scores / params.temperature
        if not bool(torch.isfinite(scaled.max())):  # a tiny temperature overflows: from the
            scaled = (scores - scores.max()) / params.temperature  # best down, never NaN
        scores = scaled
        if params.top_k > 0:
            kth = torch.topk(scores, min(params.top_k, scores.numel())).values[-1]
            scores[scores < kth] = float("-inf")
        if params.top_p < 1.0:
            ordered, order = torch.sort(scores, descending=True)
            cumulative = torch.softmax(ordered, dim=-1).cumsum(-1)
            drop = cumulative - torch.softmax(ordered, dim=-1) >= params.top_p
            drop[0] = False  # the best token always stays (a top_p under float32's range)
            scores[order[drop]] = float("-inf")
        probs = torch.softmax(scores, dim=-1)
        if not bool(torch.isfinite(probs).all()):  # nothing left to draw from: the best one
            token = int(scores.argmax())
        else:
            token = int(torch.multinomial(probs, 1, generator=generator))
    if params.logprobs is None:
        return Choice(token)
    logprobs = torch.log_softmax(raw, dim=-1)
    top = []
    if params.logprobs > 0:
        values, ids = torch.topk(logprobs, params.logprobs)
        top = list(zip(ids.tolist(), values.tolist(), strict=True))
    return Choice(token, float(logprobs[token]), top)


def prompt_logprobs(logits: torch.Tensor, ids: list[int], k: int) -> list[Choice]:
    """Logprobs of each prompt token given its prefix; the first token has none (NaN).
    logits [len, vocab], row i predicting token i + 1."""
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    out: list[Choice] = [Choice(ids[0], float("nan"), [])]
    for position, token in enumerate(ids[1:]):
        row = logprobs[position]
        top = []
        if k > 0:
            values, top_ids = torch.topk(row, k)
            top = list(zip(top_ids.tolist(), values.tolist(), strict=True))
        out.append(Choice(token, float(row[token]), top))
    return out

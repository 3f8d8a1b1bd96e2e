"""Sampling at the edges of what the API accepts: the smallest positive temperature and top_p
(once NaN probabilities and a 500), any 64-bit seed (once an overflow), all draw a token."""

from __future__ import annotations

import torch

from wire.manager import SamplingParams
from workers.inference.sampling import choose, make_generator

TINY = 5e-324  # the smallest positive double: schema-valid for temperature and top_p


def _logits() -> torch.Tensor:
    return torch.randn(1000, generator=torch.Generator().manual_seed(0))


def test_a_vanishing_temperature_or_top_p_picks_the_best_token() -> None:
    logits = _logits()
    best = int(logits.argmax())
    for params in (SamplingParams(temperature=TINY), SamplingParams(temperature=1.0, top_p=TINY),
                   SamplingParams(temperature=TINY, top_p=TINY, top_k=5)):
        generator = torch.Generator().manual_seed(1)
        assert choose(logits, params, {}, generator, True, ()).token == best, params


def test_masked_scores_with_a_vanishing_temperature_stay_inside_the_mask() -> None:
    logits = _logits()
    allowed = torch.zeros(1000, dtype=torch.bool)
    allowed[[3, 7, 11]] = True
    params = SamplingParams(temperature=TINY)
    token = choose(logits, params, {}, None, True, (), allowed).token
    assert token == max((3, 7, 11), key=lambda t: float(logits[t]))


def test_every_64_bit_seed_seeds_a_generator_per_choice() -> None:
    for seed in (2**63 - 1, -(2**63), 0, -1):
        params = SamplingParams(temperature=1.0, seed=seed)
        first, second = make_generator(params, 0), make_generator(params, 1)
        draws = [torch.randint(0, 2**30, (4,), generator=g) for g in (first, second)]
        assert not torch.equal(*draws), seed
        again = torch.randint(0, 2**30, (4,), generator=make_generator(params, 0))
        assert torch.equal(again, draws[0])

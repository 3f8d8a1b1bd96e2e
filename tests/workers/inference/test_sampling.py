"""Sampling at the edges of what the API accepts: the smallest positive temperature and top_p
(once NaN probabilities and a 500), a top_p of 0, any 64-bit seed (once an overflow), all draw
a token."""

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
                   SamplingParams(temperature=TINY, top_p=TINY, top_k=5),
                   SamplingParams(temperature=1.0, top_p=0.0)):  # OpenAI's least top_p
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


def test_rows_said_to_be_greedy_choose_the_argmax_of_what_they_may_take_and_no_other_row_is() \
        -> None:
    """The decode step gives such rows one argmax over the batch: for every combination of what
    changes a greedy choice, `greedy_only` is true exactly where `choose` returns the raw row's
    argmax, or where the row may not end yet (this row's best token is EOS, 0) its best other
    token as `mask_ends` settles it, with nothing else (a bias, a penalty or a grammar's mask,
    each of which changes the choice whether or not it may end, or logprobs); never for a
    sampled row."""
    from workers.inference.sampling import greedy_only, mask_ends

    logits = _logits()
    logits[0] = logits.max() + 1.0
    second, worst = int(logits[1:].argmax()) + 1, int(logits.argmin())
    grammar = torch.ones(1000, dtype=torch.bool)
    grammar[[0, second]] = False
    said = 0
    for temperature in (0.0, 0.7):
        for bias in ({}, {worst: 100.0}):
            for penalty, counts in ((0.0, {}), (50.0, {}), (50.0, {0: 3, second: 3})):
                for allow_eos in (True, False):
                    for mask in (None, grammar):
                        for logprobs in (None, 2):
                            params = SamplingParams(temperature=temperature, logit_bias=bias,
                                                    presence_penalty=penalty, logprobs=logprobs,
                                                    seed=1)
                            only = greedy_only(params, counts, mask is not None)
                            choice = choose(logits, params, counts, make_generator(params, 0),
                                            allow_eos, (0,), mask)
                            settled = [0]
                            mask_ends(settled, logits[None], [] if allow_eos else [0], (0,))
                            plain = choice.token == settled[0] and choice.logprob is None
                            case = (params, counts, allow_eos, mask is not None)
                            if temperature > 0:  # a draw may take the best token too
                                assert not only, case
                            else:
                                assert only == plain, case
                            said += only
    assert settled == [second]  # the best after EOS
    assert said == 4  # greedy, untouched: with or without a penalty that has nothing to count,
    # each whether or not it may end


def test_draws_follow_the_probabilities_and_never_take_a_token_of_probability_zero() -> None:
    from workers.inference.sampling import draw

    probs = torch.tensor([0.5, 0.25, 0.125, 0.0, 0.125, 0.0])
    generator = torch.Generator().manual_seed(3)
    counts = torch.bincount(torch.tensor([draw(probs, generator) for _ in range(40_000)]),
                            minlength=6)
    assert counts[3] == counts[5] == 0
    assert torch.allclose(counts / 40_000, probs, atol=0.01)
    first, second = torch.Generator().manual_seed(4), torch.Generator().manual_seed(4)
    assert [draw(probs, first) for _ in range(50)] == [draw(probs, second) for _ in range(50)]


def test_the_nucleus_keeps_the_most_probable_tokens_until_their_mass_reaches_top_p() -> None:
    from workers.inference.sampling import nucleus_drop

    def reference(probs: list[float], top_p: float) -> list[bool]:
        order = sorted(range(len(probs)), key=lambda i: -probs[i])
        kept, mass = [], 0.0
        for i in order:
            if kept and mass >= top_p:
                break
            kept.append(i)
            mass += probs[i]
        last = probs[kept[-1]]
        return [p < last for p in probs]  # ties with the last one kept stay

    for probs, top_p in (([0.15, 0.5, 0.05, 0.3], 0.8), ([0.15, 0.5, 0.05, 0.3], 0.81),
                         ([0.15, 0.5, 0.05, 0.3], 0.5), ([0.3, 0.4, 0.3], 0.5),
                         ([0.25] * 4, 0.3), ([0.7, 0.2, 0.1], TINY)):
        drop = nucleus_drop(torch.tensor(probs).log(), top_p).tolist()
        assert drop == reference(probs, top_p), (probs, top_p)

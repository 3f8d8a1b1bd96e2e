"""A request's token times as the gateway records them (a fake clock; the histograms read back
from the metrics' registry)."""

from __future__ import annotations

import pytest

from gateway.metrics import Metrics
from gateway.serving import PromptResult
from gateway.token_clock import TokenClock
from wire import manager as W


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def histogram(metrics: Metrics, name: str, tenant: str = "acme", tier: str = "default"
              ) -> tuple[float, float]:
    """(count, sum) of one tenant's histogram, of one service tier."""
    get = metrics.registry.get_sample_value
    labels = {"tenant": tenant, "tier": tier}
    return get(f"{name}_count", labels) or 0.0, get(f"{name}_sum", labels) or 0.0


def result(index: int) -> PromptResult:
    return PromptResult(index, W.Started(f"r-{index}", 3))


def test_first_token_and_the_gaps_of_each_sequence() -> None:
    metrics, clock = Metrics(), Clock()
    timer = TokenClock(metrics, "acme", 99.5, W.SamplingParams(n=2, max_tokens=3),
                       clock=clock)
    prompts = [result(0), result(1)]  # two prompts of one request, two sequences each
    arrivals = [(100.25, 0, 0), (100.25, 0, 1), (100.5, 1, 0), (100.5, 1, 1),
                (101.0, 0, 0), (101.5, 0, 1), (101.5, 1, 0), (103.5, 1, 1)]
    for at, prompt, sequence in arrivals:
        clock.now = at
        timer.tick(prompts[prompt], W.Delta(prompts[prompt].started.id, sequence, "x"))
    clock.now = 200.0  # what is not a token is not timed
    timer.tick(prompts[0], W.Done("r-0", 3, 4))
    timer.tick(prompts[1], prompts[1].started)
    assert histogram(metrics, "symbiosis_time_to_first_token_seconds") == (1, 0.75)
    assert histogram(metrics, "symbiosis_inter_token_seconds") == (4, 0.75 + 1.25 + 1.0 + 3.0)
    get = metrics.registry.get_sample_value
    assert get("symbiosis_inter_token_seconds_bucket", {"tenant": "acme", "tier": "default",
                                                         "le": "1.0"}) == 2
    assert histogram(metrics, "symbiosis_inter_token_seconds", "beta") == (0, 0)


@pytest.mark.parametrize("max_tokens", [None, 0])
def test_a_request_without_tokens_is_not_timed(max_tokens: int | None) -> None:
    metrics, clock = Metrics(), Clock()
    timer = TokenClock(metrics, "acme", 99.0, W.SamplingParams(max_tokens=max_tokens),
                       clock=clock)
    timer.tick(result(0), W.Delta("r-0", 0, "", None, "length"))
    expected = (1, 1.0) if max_tokens is None else (0, 0)  # None: as many as fit, so a token
    assert histogram(metrics, "symbiosis_time_to_first_token_seconds") == expected
    assert histogram(metrics, "symbiosis_inter_token_seconds") == (0, 0)


def test_each_token_is_counted_against_the_tenants_own_targets() -> None:
    """First token 0.75 s against 0.5 s: missed; gaps 0.75, 1.25, 1.0 and 3.0 s against 1 s:
    two met (at the target counts as met), two missed; a tenant without targets: not counted."""
    metrics, clock = Metrics(), Clock()
    timer = TokenClock(metrics, "acme", 99.5, W.SamplingParams(n=2, max_tokens=3),
                       W.TokenTargets.from_ms(500, 1000), clock=clock)
    plain = TokenClock(metrics, "beta", 99.5, W.SamplingParams(max_tokens=3), clock=clock)
    prompts = [result(0), result(1)]
    arrivals = [(100.25, 0, 0), (100.25, 0, 1), (100.5, 1, 0), (100.5, 1, 1),
                (101.0, 0, 0), (101.5, 0, 1), (101.5, 1, 0), (103.5, 1, 1)]
    for at, prompt, sequence in arrivals:
        clock.now = at
        timer.tick(prompts[prompt], W.Delta(prompts[prompt].started.id, sequence, "x"))
        plain.tick(prompts[0], W.Delta("r-0", 0, "x"))
    get = metrics.registry.get_sample_value

    def counted(tenant: str, target: str, met: str) -> float | None:
        return get("symbiosis_token_targets_total", {"tenant": tenant, "target": target,
                                                     "met": met})

    assert counted("acme", "time_to_first_token", "true") == 0
    assert counted("acme", "time_to_first_token", "false") == 1
    assert counted("acme", "inter_token", "true") == 2
    assert counted("acme", "inter_token", "false") == 2
    assert histogram(metrics, "symbiosis_inter_token_seconds", "beta")[0] == 7  # timed, and
    assert counted("beta", "inter_token", "true") is None  # not counted against anything
    assert counted("beta", "inter_token", "false") is None


def test_a_flex_requests_times_are_kept_apart_from_the_default_tiers() -> None:
    metrics, clock = Metrics(), Clock()
    flex = TokenClock(metrics, "acme", 99.0, W.SamplingParams(max_tokens=3, flex=True),
                      clock=clock)
    for at in (100.0, 102.0):
        clock.now = at
        flex.tick(result(0), W.Delta("r-0", 0, "x"))
    assert histogram(metrics, "symbiosis_time_to_first_token_seconds", tier="flex") == (1, 1.0)
    assert histogram(metrics, "symbiosis_inter_token_seconds", tier="flex") == (1, 2.0)
    assert histogram(metrics, "symbiosis_time_to_first_token_seconds") == (0, 0)


def test_a_merged_deltas_wait_is_shared_by_its_tokens() -> None:
    """A collected response's first token alone, then its tokens merged: the merged Delta's
    wait is each of its tokens' gap."""
    metrics, clock = Metrics(), Clock()
    timer = TokenClock(metrics, "acme", 99.5, W.SamplingParams(max_tokens=5), clock=clock)
    for at, tokens in ((100.0, 1), (101.5, 3), (102.0, 1)):
        clock.now = at
        timer.tick(result(0), W.Delta("r-0", 0, "x" * tokens, tokens=tokens))
    assert histogram(metrics, "symbiosis_time_to_first_token_seconds") == (1, 0.5)
    assert histogram(metrics, "symbiosis_inter_token_seconds") == (4, 2.0)
    get = metrics.registry.get_sample_value
    assert get("symbiosis_inter_token_seconds_bucket", {"tenant": "acme", "tier": "default",
                                                         "le": "0.5"}) == 4

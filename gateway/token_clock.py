"""A request's tokens timed as its client meets them: the wait for the first generated token and
each gap between one sequence's tokens, taken where the gateway receives them (a worker sends
one `Delta` per generated token of a stream; a collected response's first token alone, then the
rest merged, whose gaps are each taken as the merged Delta's wait over its tokens), for streamed
and collected responses alike, by service tier; each counted as met or missed against the
tenant's own end-to-end targets, where it set them (a flex request carries none)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from gateway.metrics import Metrics
from gateway.serving import PromptResult
from gateway.tiers import DEFAULT, FLEX
from wire import manager as W


class TokenClock:
    def __init__(self, metrics: Metrics, tenant: str, started_at: float,
                 params: W.SamplingParams, targets: W.TokenTargets = W.NO_TOKEN_TARGETS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        tier = FLEX if params.flex else DEFAULT  # a flex request's times apart (`gateway.tiers`)
        self._first_token = _Timed(metrics.first_token.labels(tenant, tier), targets.ttft_us,
                                   metrics, tenant, "time_to_first_token")
        self._between = _Timed(metrics.inter_token.labels(tenant, tier), targets.inter_token_us,
                               metrics, tenant, "inter_token")
        self._started_at = started_at
        self._clock = clock
        self._first = True
        self._generates = params.max_tokens != 0  # else its one Delta per sequence is no token
        self._last: dict[tuple[int, int], float] = {}  # (prompt, sequence) -> its last token

    def tick(self, result: PromptResult, event: W.Message) -> None:
        if not isinstance(event, W.Delta) or not self._generates:
            return
        now = self._clock()
        if self._first:
            self._first = False
            self._first_token.observe(now - self._started_at)
        sequence = (result.index, event.index)
        last = self._last.get(sequence)
        if last is not None:
            gap = (now - last) / max(event.tokens, 1)
            for _ in range(event.tokens):
                self._between.observe(gap)
        self._last[sequence] = now


class _Timed:
    """One kind of token time of a tenant: its histogram, and its target's counts if it set one."""

    def __init__(self, histogram: Any, target_us: int, metrics: Metrics, tenant: str,
                 name: str) -> None:
        self._histogram = histogram
        self._target_s = target_us / 1e6
        if target_us:
            self._met = metrics.token_targets.labels(tenant, name, "true")
            self._missed = metrics.token_targets.labels(tenant, name, "false")

    def observe(self, seconds: float) -> None:
        self._histogram.observe(seconds)
        if self._target_s:
            (self._met if seconds <= self._target_s else self._missed).inc()

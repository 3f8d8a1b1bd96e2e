"""A request's tokens timed as its client meets them: the wait for the first generated token and
each gap between one sequence's tokens, taken where the gateway receives them (a worker sends
one `Delta` per generated token), for streamed and collected responses alike."""

from __future__ import annotations

import time
from collections.abc import Callable

from gateway.metrics import Metrics
from gateway.serving import PromptResult
from wire import manager as W


class TokenClock:
    def __init__(self, metrics: Metrics, tenant: str, started_at: float,
                 params: W.SamplingParams, clock: Callable[[], float] = time.monotonic) -> None:
        self._first_token = metrics.first_token.labels(tenant)
        self._between = metrics.inter_token.labels(tenant)
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
            self._between.observe(now - last)
        self._last[sequence] = now

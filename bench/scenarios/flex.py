"""Flex (20): what another tenant's batch costs an interactive tenant, through the whole stack at
its defaults (the executor on the run's threads). Tenant t0 streams chat completions one after
another (greedy, `TOKENS` tokens each), timed as its client (the official SDK) meets them: to the
first token and between tokens. Tenant t1 keeps `LINES` requests of `BATCH_TOKENS` tokens in
flight (a batch's lines, as the Batch API runs them) in a worker of its own on the same executor.
Phases in turn, in `ROUNDS` rounds (the host's speed drifts within a minute: each side's times
are pooled over rounds taken in turn, not one phase after another): t0 alone; t0 beside t1's
requests at the flex tier; t0 beside the same requests at the default tier; t1's alone. The
batch's tokens/s beside t0 are reported against alone, so that an interactive tenant's latency
held cannot hide a batch starved to nothing."""

from __future__ import annotations

import shutil
import statistics
import tempfile
import threading
import time
from pathlib import Path

from bench.records import Record
from bench.scenarios.adapter_sides import MODEL
from bench.scenarios.common import Settings
from wire import manager as W

LINES = W.flex_seats(W.MAX_BATCH)  # a batch's lines in flight, as the gateway runs them
ROUNDS = 3  # each phase's turns (1 in toy runs)


class Batch:
    """t1's requests, `LINES` in flight at `tier` until stopped; the tokens they generated."""

    def __init__(self, client, tier: str, tokens: int) -> None:
        self.client, self.tier, self.max_tokens = client, tier, tokens
        self.tokens, self._stop = 0, threading.Event()
        self.failed: Exception | None = None
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._line, args=(k,), daemon=True)
                         for k in range(LINES)]

    def __enter__(self) -> Batch:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join()
        if self.failed is not None:  # a line that failed would leave the batch short unseen
            raise RuntimeError("a batch line failed") from self.failed

    def _line(self, k: int) -> None:
        try:
            while not self._stop.is_set():
                answer = self.client.chat.completions.create(
                    model=MODEL, messages=[{"role": "user", "content": f"Line {k} says"}],
                    max_tokens=self.max_tokens, temperature=0, service_tier=self.tier,
                    extra_body={"ignore_eos": True})
                with self._lock:
                    self.tokens += answer.usage.completion_tokens
        except Exception as exc:  # raised again in __exit__
            self.failed = exc


def interactive(client, count: int, tokens: int) -> tuple[list[float], list[float]]:
    """The times to the first token and between tokens (seconds) of `count` streamed chat
    completions one after another, each request's."""
    first_token, between = [], []
    for k in range(count):
        started, first, seen = time.perf_counter(), None, 0
        for chunk in client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": f"Hello {k}"}],
                max_tokens=tokens, temperature=0, stream=True, extra_body={"ignore_eos": True}):
            if chunk.choices and chunk.choices[0].delta.content:
                seen += 1
                first = first or time.perf_counter()
        ended = time.perf_counter()
        first_token.append(first - started)
        between.append((ended - first) / max(seen - 1, 1))
    return first_token, between


def beside(batch_client, client, tier: str, count: int, tokens: int, batch_tokens: int
           ) -> tuple[list[float], list[float], float]:
    """t0's times beside t1's requests at `tier`, and their tokens/s meanwhile."""
    with Batch(batch_client, tier, batch_tokens) as batch:
        time.sleep(0.5)  # the lines under way
        before, started = batch.tokens, time.perf_counter()
        first, between = interactive(client, count, tokens)
        rate = (batch.tokens - before) / (time.perf_counter() - started)
    return first, between, rate


class Phase:
    """One phase's figures pooled over the rounds: t0's times, and the batch's tokens/s."""

    def __init__(self) -> None:
        self.first, self.between, self.rates = [], [], []

    def add(self, first: list[float], between: list[float], rate: float | None = None) -> None:
        self.first += first
        self.between += between
        self.rates += [] if rate is None else [rate]

    def first_ms(self) -> float:
        return statistics.median(self.first) * 1e3

    def between_ms(self) -> float:
        return statistics.median(self.between) * 1e3

    def rate(self) -> float:
        return statistics.fmean(self.rates)


def batch_alone(batch_client, tier: str, seconds: float, batch_tokens: int) -> float:
    with Batch(batch_client, tier, batch_tokens) as batch:
        time.sleep(0.5)
        before, started = batch.tokens, time.perf_counter()
        time.sleep(seconds)
        return (batch.tokens - before) / (time.perf_counter() - started)


def flex(settings: Settings) -> list[Record]:
    import openai

    from launcher.ports import free_port
    from launcher.stack import Stack

    count, tokens, batch_tokens = (2, 4, 4) if settings.toy else (8, 32, 64)
    root = Path(tempfile.mkdtemp(prefix="symb-flex-"))
    try:
        stack = Stack(root / "data", MODEL, port=free_port(),
                      # t1's lines come through the API, counted in its concurrency (a batch's
                      # are not): room for them all
                      env={"SYMBIOSIS_API_KEYS": "t0=sk-t0,t1=sk-t1",
                           "SYMBIOSIS_MAX_CONCURRENT": str(max(LINES, 16))},
                      executor_args=("--threads", str(settings.threads))).start()
        try:
            t0, t1 = (openai.OpenAI(base_url=f"{stack.base_url}/v1", api_key=f"sk-{name}",
                                    max_retries=0, timeout=600) for name in ("t0", "t1"))
            interactive(t0, 1, tokens)  # both workers started: not timed
            batch_alone(t1, "flex", 0.1, batch_tokens)
            alone, with_flex, with_default, batch_rates = Phase(), Phase(), Phase(), []
            for _ in range(1 if settings.toy else ROUNDS):
                alone.add(*interactive(t0, count, tokens))
                with_flex.add(*beside(t1, t0, "flex", count, tokens, batch_tokens))
                with_default.add(*beside(t1, t0, "default", count, tokens, batch_tokens))
                batch_rates.append(batch_alone(t1, "flex", 1.0 if settings.toy else 2.0,
                                               batch_tokens))
        finally:
            stack.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    what = f"{LINES} requests of {batch_tokens} tokens in flight"
    return [
        Record("20 flex", f"an interactive tenant's time per token beside another's {what} at "
               "the flex tier vs alone", with_flex.between_ms(), alone.between_ms(), "ms",
               goal="<= 1.2x", higher_is_better=False),
        Record("20 flex", "its time to first token beside them at the flex tier vs alone",
               with_flex.first_ms(), alone.first_ms(), "ms", goal="<= 1.3x",
               higher_is_better=False),
        Record("20 flex", "its time per token beside them at the default tier vs alone",
               with_default.between_ms(), alone.between_ms(), "ms", higher_is_better=False),
        Record("20 flex", "the batch's tokens/s beside the interactive tenant at the flex tier "
               "vs alone", with_flex.rate(), statistics.fmean(batch_rates), "tokens/s"),
        Record("20 flex", "the batch's tokens/s beside it at the default tier vs alone",
               with_default.rate(), statistics.fmean(batch_rates), "tokens/s"),
    ]

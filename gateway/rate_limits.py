"""A tenant's requests and tokens per minute (`requests_per_minute`, `tokens_per_minute`), as
OpenAI limits an organization's: a bucket of each that holds a minute's worth and refills
continuously, reported on every response (`x-ratelimit-*`) and a 429 with `retry-after-ms`
when it runs dry, so that one tenant's burst never takes the gateway or the base model from
the others for longer than its share.

A request with a key costs 1 of its tenant's requests when it arrives, before any of its body
is read (a batch's lines and a background response's run are the one request that created
them; the dashboard's reads in a signed-in browser are not counted). Tokens: a generation needs
its prompt's tokens (as the KV budget counts them) in the bucket to start, and takes them; each
token it generates is taken as it comes, so a long answer leaves the bucket owing and the
tenant's next request waits until the minute has paid it back; once it ends, the worker's count
of its prompt sets the estimate right, and one that never ran gives back what it took. A prompt
larger than a whole minute's tokens could never start: a 400.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from gateway.errors import APIError
from gateway.tenants import Tenant
from wire import manager as W

COUNTED = "symbiosis.request_counted"  # a request's scope: its one request taken (the body
# guard takes it before any of a body is read, the tenant dependency otherwise)
REQUESTS = "requests"
TOKENS = "tokens"
NAMES = {REQUESTS: "requests per minute (RPM)", TOKENS: "tokens per minute (TPM)"}


@dataclass
class Bucket:
    per_minute: int
    level: float  # what may be taken now (below 0: what generated tokens owe)
    at: float  # when `level` was last brought up to date

    def refill(self, now: float) -> None:
        self.level = min(self.per_minute, self.level + (now - self.at) * self.per_minute / 60)
        self.at = now

    def wait_s(self, amount: float) -> float:
        """Seconds until the bucket holds `amount`."""
        return max(0.0, (amount - self.level) * 60 / self.per_minute)


class RateLimits:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._buckets: dict[tuple[str, str], Bucket] = {}
        self._lock = threading.Lock()  # sync dependencies take requests in a thread pool

    def take_request(self, tenant: Tenant) -> None:
        """Count one request of the tenant's, or the 429 if its minute's are spent."""
        self._take(tenant, REQUESTS, tenant.requests_per_minute, 1)

    def take_prompt(self, tenant: Tenant, tokens: int) -> None:
        """Take a request's prompt tokens, or refuse it: the 429 until the bucket holds them,
        the 400 where a whole minute's would not."""
        if tenant.tokens_per_minute and tokens > tenant.tokens_per_minute:
            raise APIError(400, f"This request's prompt has about {tokens} tokens, more than "
                           f"tenant {tenant.id}'s limit of {tenant.tokens_per_minute} "
                           f"{NAMES[TOKENS]}; shorten it.", "tokens_per_minute_exceeded")
        self._take(tenant, TOKENS, tenant.tokens_per_minute, tokens)

    def spend(self, tenant: Tenant, tokens: int) -> None:
        """Take generated tokens (never refused: the bucket may owe them), or give some back
        (never past a full bucket)."""
        with self._lock:
            if (bucket := self._bucket(tenant.id, TOKENS, tenant.tokens_per_minute)):
                bucket.level = min(bucket.per_minute, bucket.level - tokens)

    def headers(self, tenant: Tenant) -> dict[str, str]:
        """OpenAI's `x-ratelimit-*` headers of each limit the tenant has."""
        return {f"x-ratelimit-{name}-{kind}": str(value)
                for kind, figures in self._figures(tenant).items()
                for name, value in figures.items()}

    def report(self, tenant: Tenant) -> dict[str, dict | None]:
        """Each limit's `limit`, `remaining` and `reset`, as the headers say them (None: no
        limit)."""
        figures = self._figures(tenant)
        return {kind: figures.get(kind) for kind in (REQUESTS, TOKENS)}

    def _figures(self, tenant: Tenant) -> dict[str, dict]:
        """Each limit the tenant has: its `limit`, `remaining` (whole, 0 while owing) and
        `reset` (the time until it is full again)."""
        limits = {kind: per_minute for kind, per_minute in (
            (REQUESTS, tenant.requests_per_minute), (TOKENS, tenant.tokens_per_minute))
            if per_minute}
        if not limits:
            return {}  # (no lock on the way of every unlimited tenant's request)
        with self._lock:
            buckets = {kind: self._bucket(tenant.id, kind, n) for kind, n in limits.items()}
            return {kind: {"limit": limits[kind], "remaining": max(0, int(bucket.level)),
                           "reset": duration(bucket.wait_s(limits[kind]))}
                    for kind, bucket in buckets.items()}

    def _take(self, tenant: Tenant, kind: str, per_minute: int, amount: int) -> None:
        if not per_minute:
            return
        with self._lock:
            bucket = self._bucket(tenant.id, kind, per_minute)
            if bucket.level < amount:
                wait_s = bucket.wait_s(amount)
                raise APIError(429, f"Rate limit reached for {NAMES[kind]} of tenant "
                               f"{tenant.id}: limit {per_minute}, remaining "
                               f"{max(0, int(bucket.level))}, requested {amount}. Please try "
                               f"again in {duration(wait_s)}.", "rate_limit_exceeded",
                               headers=retry_after(wait_s))
            bucket.level -= amount

    def _bucket(self, tenant_id: str, kind: str, per_minute: int) -> Bucket | None:
        """The tenant's bucket of this kind brought up to date (None: no limit). A limit changed
        in the tenants file keeps what the bucket held, up to the new limit."""
        if not per_minute:
            return None
        now = self._clock()
        bucket = self._buckets.get((tenant_id, kind))
        if bucket is None:
            bucket = self._buckets[tenant_id, kind] = Bucket(per_minute, per_minute, now)
        elif bucket.per_minute != per_minute:
            bucket.refill(now)
            bucket.per_minute, bucket.level = per_minute, min(bucket.level, per_minute)
        bucket.refill(now)
        return bucket


def count_request(state, scope: dict, tenant: Tenant) -> None:
    """Take one of the tenant's requests for this request (once, whoever asks first), its refusal
    counted in `symbiosis_rejected`."""
    if scope.get(COUNTED):
        return
    scope[COUNTED] = True
    try:
        state.rate_limits.take_request(tenant)
    except APIError:
        state.metrics.rejected.labels(tenant.id, "requests_per_minute").inc()
        raise


def retry_after(wait_s: float) -> dict[str, str]:
    """The headers the official SDKs wait by (`retry-after-ms` first)."""
    return {"retry-after": str(max(1, math.ceil(wait_s))),
            "retry-after-ms": str(max(1, math.ceil(wait_s * 1000)))}


def duration(seconds: float) -> str:
    """A wait as OpenAI's headers write it: `120ms`, `1.5s`, `6m0s`."""
    if seconds <= 0:
        return "0s"
    if seconds < 1:
        return f"{math.ceil(seconds * 1000)}ms"
    minutes, rest = divmod(round(seconds, 3), 60)
    text = f"{rest:.3f}".rstrip("0").rstrip(".") + "s"
    return f"{int(minutes)}m{text}" if minutes else text


class TokenMeter:
    """One request's tokens as its tenant's bucket takes them: its prompts' estimate before it
    starts (`RateLimits.take_prompt`), each generated token as it comes, then each prompt's
    exact count from its `Done` (what was taken for it set right)."""

    def __init__(self, limits: RateLimits, tenant: Tenant, estimates: list[int]) -> None:
        self._limits, self._tenant = limits, tenant
        self._taken = list(estimates)  # per prompt: its tokens taken so far

    def give_back(self) -> None:
        """Return what was taken: the request never ran."""
        if self._tenant.tokens_per_minute:
            self._limits.spend(self._tenant, -sum(self._taken))
            self._taken = [0] * len(self._taken)

    def tick(self, index: int, event: W.Message) -> None:
        if not self._tenant.tokens_per_minute:
            return
        if isinstance(event, W.Delta):
            amount = event.tokens
        elif isinstance(event, W.Done):
            amount = event.prompt_tokens + event.completion_tokens - self._taken[index]
        else:
            return
        self._taken[index] += amount
        self._limits.spend(self._tenant, amount)

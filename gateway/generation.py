"""The shared path of both completion endpoints: limits, run, JSON or SSE, metrics."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from gateway import kv_budget
from gateway.errors import RETRY_SOON, APIError
from gateway.fingerprint import fingerprint, stamped
from gateway.rate_limits import TokenMeter
from gateway.responses import sse
from gateway.serving import PromptResult, Run, Target, watch_disconnect
from gateway.tenants import Tenant
from gateway.tiers import batch_line, named
from gateway.token_clock import TokenClock
from wire import manager as W

log = logging.getLogger("gateway.generation")
FALLBACK_HEADER = "x-symbiosis-fallback"
VERSION_HEADER = "x-symbiosis-model-version"  # which version answered: `acme/bot@3`
T = TypeVar("T")


@dataclass
class Call:
    """One API call being served."""

    request: Request
    tenant: Tenant
    target: Target
    response_id: str
    created: int
    started_at: float
    answered: str = ""  # the version that answered (the base model when it fell back)
    fingerprint: str = ""  # its `system_fingerprint`
    flex: bool = False  # served at the flex tier (`gateway.tiers`)

    def stamp(self, made: dict) -> dict:
        """`made` with its fingerprint and tier, if it is an object that carries them."""
        return named(stamped(made, self.fingerprint), self.flex)


ChunkMaker = Callable[[Call, PromptResult, W.Message], list[dict]]
BodyMaker = Callable[[Call, list[PromptResult]], dict]
Kept = Callable[[dict], Awaitable[None]]
Watch = Callable[[PromptResult, W.Message], None]


def admit(state, tenant: Tenant) -> None:
    """One more of the tenant's requests in flight (release it with `state.tenants.release`),
    or a 429 where it has as many as it may."""
    if not state.tenants.acquire(tenant):
        state.metrics.rejected.labels(tenant.id, "concurrency").inc()
        raise APIError(429, f"Too many concurrent requests for tenant {tenant.id} (limit "
                       f"{tenant.max_concurrent}); retry when one finishes.",
                       "rate_limit_exceeded", headers=RETRY_SOON)


async def _admitted(state, tenant: Tenant, prompts: list[dict], params: W.SamplingParams,
                    slot: bool) -> tuple[int, TokenMeter]:
    """The request's place within its tenant's limits, each taken in turn and let go again
    where a later one refuses: a concurrency slot (`admit`; where `slot`), its share of the KV
    budget (what to free when it ends), its prompt's tokens per minute (the meter takes its
    generated ones)."""
    if slot:
        admit(state, tenant)
    kv_held = 0
    try:
        lengths = await kv_budget.counted(state.text_tokens, tenant, prompts, params)
        kv_held = _refused_as(state, tenant, "kv_budget", kv_budget.reserve, state.tenants,
                              state.text_tokens, tenant, lengths, params)
        _refused_as(state, tenant, "tokens_per_minute", state.rate_limits.take_prompt, tenant,
                    sum(lengths))
    except BaseException:  # a 400 or 429, or the client gone while it was counted
        if slot:
            state.tenants.release(tenant)
        state.tenants.free_kv(tenant, kv_held, params.flex)
        raise
    return kv_held, TokenMeter(state.rate_limits, tenant, lengths)


def _refused_as(state, tenant: Tenant, reason: str, take: Callable, *args):
    """`take(*args)`, a 429 it raises counted as a refusal for `reason`."""
    try:
        return take(*args)
    except APIError as refused:
        if refused.status == 429:
            state.metrics.rejected.labels(tenant.id, reason).inc()
        raise


async def generate(request: Request, tenant: Tenant, target: Target, prompts: list[dict],
                   params: W.SamplingParams, *, prefix: str, stream: bool,
                   include_usage: bool, body: BodyMaker, chunks: ChunkMaker,
                   usage_chunk: Callable[[Call, list[PromptResult]], dict],
                   user: str | None = None, done_marker: bool = True,
                   settle: Callable[[dict], Awaitable[dict]] | None = None,
                   failed: Callable[[Call, APIError], Awaitable[list[dict]]] | None = None,
                   named: tuple[str, int] | None = None,
                   started: Callable[[Call], Awaitable[None]] | None = None,
                   obfuscate: bool = False, kept: Kept | None = None,
                   let_go: Callable[[], None] | None = None,
                   respond: Callable[[dict, dict[str, str]], Response] | None = None):
    """`usage_chunk`: a stream's last chunk where `include_usage`; `done_marker`: a stream
    ends with `data: [DONE]` (the completion APIs; the Responses API's last event ends it);
    `settle`: what is done with the whole answer (the body, or a stream's last chunk) before
    the client has it, and the answer as it then is (the Responses API stores it); `failed`:
    a stream's last chunks where it breaks off (by default the error's body, as OpenAI's
    completion streams send it); `named`: the (id, created) the answer has (a background
    response's, made before); `started`: what is done once the run has started;
    `obfuscate`: a stream's deltas are padded (`gateway.obfuscation`); `kept`: what is done
    with the whole answer as a body (`body`'s, a stream's too) once it is complete, before the
    client has it or its stream's end (a stored chat completion is kept); `let_go`: what else
    the request held, let go with its concurrency slot once it ends (a conversation's turn);
    `respond`: the response that sends the whole answer, given it and the headers (by default
    JSON rendered in one piece; the embeddings' megabytes of numbers are rendered piecewise by
    worker threads as they are sent)."""
    state = request.app.state
    log.info("request %s: tenant %s, model %s, %d prompt(s)%s", request.state.request_id,
             tenant.id, target.model, len(prompts), f", end user {user!r}" if user else "")
    slot = not batch_line(request)  # a batch's lines run in slots of their own
    params.flex = params.flex or not slot
    params.collected = not stream  # its tokens come merged (`workers.inference.merging`)
    kv_held, meter = await _admitted(state, tenant, prompts, params, slot)
    state.metrics.inflight.labels(tenant.id).inc()
    released = False

    def release() -> None:
        nonlocal released
        if not released:
            released = True
            if slot:
                state.tenants.release(tenant)
            state.tenants.free_kv(tenant, kv_held, params.flex)
            state.metrics.inflight.labels(tenant.id).dec()
            if let_go:
                let_go()

    response_id, created = named or (f"{prefix}{uuid.uuid4().hex}", int(time.time()))
    call = Call(request, tenant, target, response_id, created,
                getattr(request.state, "received", None) or time.monotonic(), flex=params.flex)
    run = None
    try:
        run = await _unless_gone(request, state.serving.start(
            tenant, target, request.state.request_id, prompts, params, received=call.started_at))
        if started:
            await started(call)
    except BaseException:
        if run is None:  # nothing ran: its prompt's tokens go back
            meter.give_back()
        release()
        raise
    clock = TokenClock(state.metrics, tenant.id, call.started_at, params,
                       W.NO_TOKEN_TARGETS if params.flex else tenant.token_targets())

    def tick(result: PromptResult, event: W.Message) -> None:
        clock.tick(result, event)
        meter.tick(result.index, event)

    call.answered = state.settings.model if run.fallback else target.model
    call.fingerprint = fingerprint(state.settings.model, call.answered, run.backend)
    headers = {VERSION_HEADER: call.answered}
    if run.fallback:
        headers[FALLBACK_HEADER] = "base-model"
        state.metrics.fallbacks.labels(tenant.id).inc()
    if stream:
        ending = Ending(usage_chunk, done_marker, settle, failed, body, kept)
        return Stream(_stream(call, run, tick, chunks, include_usage, ending, release,
                              obfuscate), ended=lambda: _ended(run, release),
                      media_type="text/event-stream",
                      headers={**headers, "cache-control": "no-cache"})
    try:
        try:
            results = await _unless_gone(request, run.collect(tick))
        except APIError:
            await run.close()  # the task may have been cancelled before it ever ran
            raise
        _count(call, results)
        made = call.stamp(body(call, results))
        if kept:
            await kept(made)
        answer = await settle(made) if settle else made
        return respond(answer, headers) if respond else JSONResponse(answer, headers=headers)
    finally:
        release()


async def _unless_gone(request: Request, work: Awaitable[T]) -> T:
    """What `work` comes to, unless the client goes away first: then it is cancelled, and the
    request ends 499 (the prompts of an embeddings request, or a long prompt's prefill, are
    aborted, not run on for nobody)."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(watch_disconnect(request, task))
    try:
        return await task
    except asyncio.CancelledError:
        raise APIError(499, "client closed the request", "client_closed") from None
    finally:
        watcher.cancel()


@dataclass(frozen=True)
class Ending:
    """How a stream ends (`generate`'s arguments of the same names)."""

    usage_chunk: Callable[[Call, list[PromptResult]], dict]
    done_marker: bool
    settle: Callable[[dict], Awaitable[dict]] | None
    failed: Callable[[Call, APIError], Awaitable[list[dict]]] | None
    body: BodyMaker
    kept: Kept | None


async def _stream(call: Call, run: Run, tick: Watch, chunks: ChunkMaker,
                  include_usage: bool, end: Ending, release,
                  obfuscate: bool) -> AsyncIterator[bytes]:
    try:
        for result in run.results:
            for chunk in chunks(call, result, result.started):
                yield sse(call.stamp(chunk), obfuscate)
        async for result, event in run.events():
            tick(result, event)
            for chunk in chunks(call, result, event):
                yield sse(call.stamp(chunk), obfuscate)
        _count(call, run.results)
        if end.kept:
            await end.kept(call.stamp(end.body(call, run.results)))
        if include_usage:
            last = call.stamp(end.usage_chunk(call, run.results))
            yield sse(await end.settle(last) if end.settle else last)
    except APIError as exc:
        log.warning("request %s failed mid-stream: %s", call.response_id, exc.message)
        for chunk in await end.failed(call, exc) if end.failed else [exc.body()]:
            yield sse(chunk)
    finally:
        await _ended(run, release)
    if end.done_marker:
        yield sse("[DONE]")


async def _ended(run: Run, release: Callable[[], None]) -> None:
    release()
    with contextlib.suppress(Exception):
        await run.close()


class Stream(StreamingResponse):
    """A stream whose end lets go what its request held (`ended`) even where its body never
    began: a client gone before the first chunk cancels the sending before the body's
    generator starts, and so before its own clean-up could run."""

    def __init__(self, content: AsyncIterator[bytes], *, ended: Callable[[], Awaitable[None]],
                 **kw) -> None:
        super().__init__(content, **kw)
        self.ended = ended

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self.ended()


def _count(call: Call, results: list[PromptResult]) -> None:
    metrics = call.request.app.state.metrics
    prompt = sum(r.started.prompt_tokens for r in results)
    completion = sum(r.done.completion_tokens for r in results if r.done)
    name, version = call.answered.partition("@")[::2]
    metrics.responses.labels(call.tenant.id, name, version).inc()
    metrics.tokens.labels(call.tenant.id, name, version, "prompt").inc(prompt)
    metrics.tokens.labels(call.tenant.id, name, version, "completion").inc(completion)

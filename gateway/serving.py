"""Running a generation for the HTTP layer: resolve the model, fan prompts out to the worker
manager, and hand back either the collected results or a merged stream of events.

Every prompt of a request becomes one `Generate`, all sent at once; the first event of each
(Started, or Failed, which becomes an HTTP error) is awaited before any response starts, so
errors keep their status code and the fallback header can be set. If the client goes away, every
prompt is aborted.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from fastapi import Request

from gateway.errors import APIError, model_not_found
from gateway.manager_client import ManagerClient, ManagerUnavailable
from gateway.tenants import Tenant
from state.adapters import AdapterReader
from state.versions import choose, split_id, weights
from wire import manager as W
from wire.call.messages import NO_TARGETS

log = logging.getLogger("gateway.serving")
REFUSED_PARAMS = {"invalid_logit_bias": "logit_bias", "invalid_n": "n"}  # the worker's refusals


def refused(event: W.Failed) -> APIError:
    return APIError(event.status, event.message, event.code, REFUSED_PARAMS.get(event.code))


@dataclass(frozen=True)
class Target:
    model: str  # what runs: the base model or one version of an adapter (`acme/bot@3`)
    adapter: W.AdapterRef | None


@dataclass
class PromptResult:
    index: int
    started: W.Started
    text: dict[int, str] = field(default_factory=dict)
    logprobs: dict[int, list[W.TokenLogprob]] = field(default_factory=dict)
    finish: dict[int, str] = field(default_factory=dict)
    done: W.Done | None = None


class Run:
    """One API request's generations, one per prompt."""

    def __init__(self, manager: ManagerClient, requests: list[W.Generate],
                 first_timeout_s: float) -> None:
        self.manager = manager
        self.ids = [r.id for r in requests]
        self.streams = [manager.generate(r, first_timeout_s) for r in requests]
        self.results: list[PromptResult] = []
        self.finished: set[str] = set()

    async def start(self) -> None:
        """Send every prompt at once and wait for each to start; the first error to arrive
        becomes an APIError (and stops the rest). Sent one after another's start, a request's
        prompts would be prefilled (an embedding's answered) one forward each."""
        arrived: asyncio.Queue[int] = asyncio.Queue()
        firsts = [asyncio.ensure_future(anext(stream)) for stream in self.streams]
        for index, first in enumerate(firsts):
            first.add_done_callback(lambda _, index=index: arrived.put_nowait(index))
        started: dict[int, W.Started] = {}
        try:
            while len(started) < len(firsts):
                index = await arrived.get()
                first = firsts[index].result()
                if isinstance(first, W.Failed):
                    self.finished.add(first.id)
                    raise refused(first)
                if not isinstance(first, W.Started):
                    raise APIError(500, "unexpected first event from the worker", "internal_error")
                started[index] = first
        except BaseException:
            await self.close()
            for first in firsts:
                first.cancel()
            await asyncio.gather(*firsts, return_exceptions=True)
            raise
        self.results = [PromptResult(index, started[index]) for index in range(len(firsts))]

    @property
    def fallback(self) -> bool:
        return any(r.started.fallback for r in self.results)

    @property
    def backend(self) -> str:
        """What computed it (one worker answers every prompt of a request)."""
        return self.results[0].started.backend if self.results else ""

    async def collect(self, watch: Callable[[PromptResult, W.Message], None] | None = None
                      ) -> list[PromptResult]:
        """Every prompt's result, whole; `watch` sees each event as it comes."""
        async for result, event in self.events():
            if watch is not None:
                watch(result, event)
        return self.results

    async def events(self) -> AsyncIterator[tuple[PromptResult, W.Message]]:
        """Deltas and Done events of all prompts, merged, each applied to its result first."""
        queue: asyncio.Queue = asyncio.Queue()
        pumps = [asyncio.create_task(self._pump(result, stream, queue))
                 for result, stream in zip(self.results, self.streams, strict=True)]
        try:
            remaining = len(pumps)
            while remaining:
                result, event = await queue.get()
                if event is None:
                    remaining -= 1
                    continue
                if isinstance(event, (W.Done, W.Failed)):
                    self.finished.add(event.id)
                if isinstance(event, W.Failed):
                    raise refused(event)
                self._apply(result, event)
                yield result, event
        finally:
            for pump in pumps:
                pump.cancel()
            await self.close()

    async def close(self) -> None:
        """Stop every prompt: unfinished ones are aborted here, not left to the streams' own
        clean-up (a stream never iterated again is only closed when it is garbage collected)."""
        for request_id in self.ids:
            if request_id not in self.finished:
                self.finished.add(request_id)
                await self.manager.abort(request_id)
        for stream in self.streams:
            with contextlib.suppress(Exception):
                await stream.aclose()

    @staticmethod
    async def _pump(result: PromptResult, stream, queue: asyncio.Queue) -> None:
        try:
            async for event in stream:
                await queue.put((result, event))
        finally:
            await queue.put((result, None))

    @staticmethod
    def _apply(result: PromptResult, event: W.Message) -> None:
        if isinstance(event, W.Delta):
            result.text[event.index] = result.text.get(event.index, "") + event.text
            if event.logprobs:
                result.logprobs.setdefault(event.index, []).extend(event.logprobs)
            if event.finish_reason:
                result.finish[event.index] = event.finish_reason
        elif isinstance(event, W.Done):
            result.done = event


class Serving:
    def __init__(self, manager: ManagerClient, registry: AdapterReader, base_model: str,
                 first_timeout_s: float) -> None:
        self.manager = manager
        self.registry = registry
        self.base_model = base_model
        self.first_timeout_s = first_timeout_s

    def resolve(self, tenant: Tenant, model: str, user: str | None = None) -> Target:
        """The version that answers a request for `model`: the one named (`name@3`), or the
        name's serving version (by its split's weights, sticky per `user`)."""
        if model == self.base_model:
            return Target(model, None)
        name, number = split_id(model)
        record = self.registry.visible(name, tenant.id)
        if record is None:
            raise model_not_found(model)
        split = weights(record.serving)
        if number is None:
            if not split:
                raise APIError(409, f"{model} did not pass its quality gates (see its job's "
                               "`gates`), so no version of it is in service; to serve it "
                               f"anyway: POST /v1/adapters/{model}/promote.",
                               "model_not_in_service", "model")
            number = choose(name, split, user)
        version = self.registry.versions.get(name, number)
        if version is None:
            raise model_not_found(model)
        if not version.passed_gates and number not in [n for n, _ in split]:
            raise APIError(409, f"{model} did not pass its quality gates and is not in "
                           f"service; to serve it anyway: POST /v1/adapters/{name}/promote "
                           f"with {{\"version\": {number}}}.", "model_not_in_service", "model")
        return Target(version.id, W.AdapterRef(version.path, version.peft_type))

    async def start(self, tenant: Tenant, target: Target, request_id: str,
                    prompts: list[dict], params: W.SamplingParams,
                    received: float | None = None) -> Run:
        """`received`: when the request reached the gateway (time.monotonic(); None: now)."""
        waited_us = 0 if received is None else max(round((time.monotonic() - received) * 1e6), 0)
        targets, token_targets = (NO_TARGETS, W.NO_TOKEN_TARGETS) if params.flex else \
            (tenant.call_targets(), tenant.token_targets())  # flex: no hurry (`gateway.tiers`)
        requests = [W.Generate(f"{request_id}-{i}", tenant.id, target.model, params,
                               target.adapter, max_context=tenant.max_context,
                               fallback=tenant.fallback, targets=targets,
                               token_targets=token_targets, waited_us=waited_us,
                               **prompt)
                    for i, prompt in enumerate(prompts)]
        if not self.manager.up:
            raise APIError(503, "The worker manager is not reachable; try again shortly.",
                           "service_unavailable")
        run = Run(self.manager, requests, self.first_timeout_s)
        try:
            await run.start()
        except ManagerUnavailable as exc:
            raise APIError(503, str(exc), "service_unavailable") from None
        return run


async def watch_disconnect(request: Request, task: asyncio.Task) -> None:
    """Cancel `task` when the HTTP client goes away (non-streaming responses). The body has been
    read, so the next ASGI message can only be the disconnect: wait for it (polling with
    `is_disconnected()` never sees it behind a BaseHTTPMiddleware)."""
    while not task.done():
        message = await request.receive()
        if message["type"] == "http.disconnect":
            task.cancel()
            return

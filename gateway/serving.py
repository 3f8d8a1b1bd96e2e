"""Running a generation for the HTTP layer: resolve the model, fan prompts out to the worker
manager, and hand back either the collected results or a merged stream of events.

Every prompt of a request becomes one `Generate`, all sent at once (one frame), their replies in
one inbox; the first event of each (Started, or Failed, which becomes an HTTP error) is awaited
before any response starts, so errors keep their status code and the fallback header can be set.
If the client goes away, every prompt is aborted.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from fastapi import Request

from gateway.errors import APIError, model_not_found
from gateway.inbox import Inbox
from gateway.manager_client import ManagerClient, ManagerUnavailable
from gateway.tenants import Tenant
from state.adapters import AdapterReader
from state.versions import choose, split_id, weights
from wire import manager as W
from wire.call.messages import NO_TARGETS

log = logging.getLogger("gateway.serving")
REFUSED_PARAMS = {"invalid_logit_bias": "logit_bias", "invalid_n": "n"}  # the worker's refusals


def run_id(request_id: str) -> str:
    """What a request's prompts' ids on the wire start with (`{run_id}-{i}`): unique whatever
    `x-request-id` a client sent (replies are routed by id, and two requests that shared one
    would share their replies), led by the request's id (its first 64 characters) so that each
    process's log lines name it."""
    return f"{request_id[:64]}.{uuid.uuid4().hex[:16]}"


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
    """One API request's generations, one per prompt, whose replies all come to one inbox (a
    request of 2,048 inputs waits on one inbox, not on 2,048 streams and their tasks)."""

    def __init__(self, manager: ManagerClient, requests: list[W.Generate],
                 first_timeout_s: float, next_timeout_s: float) -> None:
        self.manager = manager
        self.requests = requests
        self.first_timeout_s = first_timeout_s
        self.next_timeout_s = next_timeout_s
        self.ids = [r.id for r in requests]
        self.results: list[PromptResult] = []
        self.finished: set[str] = set()
        self._index = {request_id: i for i, request_id in enumerate(self.ids)}
        self._inbox: Inbox | None = None
        self._early: deque[W.Message] = deque()  # came before every prompt had started
        self._heard: dict[str, float] = {}  # the unfinished prompts, last heard from first

    async def start(self) -> None:
        """Send every prompt at once and wait for each to start; the first error to arrive
        becomes an APIError (and stops the rest). Sent one after another's start, a request's
        prompts would be prefilled (an embedding's answered) one forward each."""
        self._inbox = self.manager.open(self.requests)
        deadline = time.monotonic() + self.first_timeout_s
        started: dict[int, W.Started] = {}
        try:
            while len(started) < len(self.ids):
                event = await self._receive(deadline)
                if event is None:
                    late = next(i for i in self.ids if self._index[i] not in started)
                    raise self._timed_out(late, self.first_timeout_s)
                index = self._index[event.id]
                if isinstance(event, W.Failed):
                    raise refused(event)
                if index in started:
                    self._early.append(event)
                elif isinstance(event, W.Started):
                    started[index] = event
                else:
                    raise APIError(500, "unexpected first event from the worker", "internal_error")
        except BaseException:
            await self.close()
            raise
        self.results = [PromptResult(index, started[index]) for index in range(len(self.ids))]

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
        """Deltas and Done events of all prompts as they come, each applied to its result first;
        a prompt that goes `next_timeout_s` without an event fails the run (503)."""
        try:
            while self._early or self._heard:
                if self._early:
                    event = self._early.popleft()
                else:
                    quiet = next(iter(self._heard))
                    event = await self._receive(self._heard[quiet] + self.next_timeout_s)
                    if event is None:
                        raise self._timed_out(quiet, self.next_timeout_s)
                if isinstance(event, W.Failed):
                    raise refused(event)
                result = self.results[self._index[event.id]]
                self._apply(result, event)
                yield result, event
        finally:
            await self.close()

    async def close(self) -> None:
        """Stop every prompt: the unfinished ones are aborted (once, in one message)."""
        unfinished = [request_id for request_id in self.ids if request_id not in self.finished]
        self._heard.clear()
        if unfinished:
            self.finished.update(unfinished)
            await self.manager.abort(unfinished)

    async def _receive(self, deadline: float) -> W.Message | None:
        """The next event of any prompt; None after `deadline` (`time.monotonic()`), or once
        the manager went silent."""
        event = await self.manager.next(self._inbox, deadline - time.monotonic())
        if event is None:
            return None
        self._heard.pop(event.id, None)
        if isinstance(event, (W.Done, W.Failed)):
            self.finished.add(event.id)
            self.manager.forget(event.id)
        else:
            self._heard[event.id] = time.monotonic()
        return event

    def _timed_out(self, request_id: str, timeout_s: float) -> APIError:
        """The request fails (503) for `request_id`'s silence; `close` aborts it."""
        reason = f"no answer from a worker within {timeout_s:.0f} s" if self.manager.up \
            else "the worker manager stopped answering"
        log.warning("prompt %s: %s", request_id, reason)
        return APIError(503, reason, "timeout")

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
                 first_timeout_s: float, next_timeout_s: float) -> None:
        self.manager = manager
        self.registry = registry
        self.base_model = base_model
        self.first_timeout_s = first_timeout_s
        self.next_timeout_s = next_timeout_s

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
        run = run_id(request_id)
        requests = [W.Generate(f"{run}-{i}", tenant.id, target.model, params,
                               target.adapter, max_context=tenant.max_context,
                               fallback=tenant.fallback, targets=targets,
                               token_targets=token_targets, waited_us=waited_us,
                               group=run, **prompt)
                    for i, prompt in enumerate(prompts)]
        if not self.manager.up:
            raise APIError(503, "The worker manager is not reachable; try again shortly.",
                           "service_unavailable")
        run = Run(self.manager, requests, self.first_timeout_s, self.next_timeout_s)
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

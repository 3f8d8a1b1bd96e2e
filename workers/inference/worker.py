"""One inference worker process: one tenant's base model and any of its adapters (`adapters`),
with their KV caches.

config -> build the base model -> Ready -> loop: drain messages, one step of each engine with
work, send events. The loop never blocks while an engine has work, so new requests join between
decode steps; a long prompt is tokenized and a large constraint compiled meanwhile by a thread
of their own (`preparer`), so it holds up no other request's steps.
"""

from __future__ import annotations

import logging
import math
import os
import time
from functools import partial
from typing import Any

import msgspec
import zmq

from wire import manager as W
from wire.call.messages import CallTargets
from wire.spawner import WorkerSpec
from workers.inference.adapters import AdapterLoadError, Adapters
from workers.inference.budget import Budget
from workers.inference.engine import Emit, InferenceEngine
from workers.inference.grammar import Grammars
from workers.inference.intake import Intake
from workers.inference.memory import Reserve
from workers.inference.pacing import Pacer
from workers.inference.preloaded import Preloaded
from workers.inference.preparer import Prepared, Preparer, heavy, prepare
from workers.inference.request import Request
from workers.remote.handle import ExecutorError, ExecutorUnavailable
from workers.threads import ForwardThreads

log = logging.getLogger("workers.worker")
# How long a drain of messages holds up the next step of sequences that decode, or the first
# token of a prompt taken, at most: a request of 2,048 inputs (one frame) takes ~0.2 s to take in
# (~0.1 ms each to tokenize and queue), which stalled every sequence decoding beside it; now they
# come in between its steps. With none decoding and only embeddings taken, a drain takes all:
# the step that follows is then as full as it can be.
DRAIN_S = 0.01


def build_adapters(config: WorkerSpec, preloaded: Preloaded,
                   threads: ForwardThreads | None = None) -> Adapters:
    """The tenant's base model on the executor, and the adapters it will load into it; each base
    model's forwards on as many of its `threads` as their tokens keep busy."""
    import torch

    from workers.device import claim_device
    from workers.remote.build import remote_model
    from workers.remote.client import ExecutorClient

    torch.set_num_threads(config.threads)
    threads = threads or ForwardThreads(config.threads)
    device = str(claim_device(config.device))
    client = ExecutorClient(config.executor, name=config.key, device=device)

    def build_base() -> Any:  # every base model of the worker calls through one connection
        model = remote_model(config.base, client, privacy=config.privacy, device=device)
        threads.attach(model)
        return model

    def make_engine(model: Any) -> InferenceEngine:
        pacer = Pacer(carry, lambda: client.calls, lambda: client.own_targets)
        return InferenceEngine(model, preloaded.tokenizer, max_context=preloaded.max_context,
                               eos_ids=preloaded.eos_ids, max_batch=config.max_batch,
                               kv_budget_bytes=config.kv_budget_bytes, pace=pacer.pace,
                               chunk_tokens=config.prefill_chunk_tokens)

    def carry(targets: CallTargets) -> None:
        client.targets = targets

    budget = Budget(config.max_adapters, config.adapter_bytes, config.tenant_adapter_bytes)
    return Adapters(build_base(), make_engine, build_base, device=device, budget=budget,
                    backend=backend_of(client))


def backend_of(client: Any) -> str:
    """What computes a worker's tokens, as `system_fingerprint` tells it: the executor's dtype
    and device."""
    return f"{str(client.dtype).removeprefix('torch.')} on {client.device}"


def load_failed(key: str, exc: Exception) -> W.LoadFailed:
    from workers.device import DeviceUnavailable

    if isinstance(exc, ExecutorUnavailable):
        return W.LoadFailed(key, "executor unavailable", "executor_unavailable")
    if isinstance(exc, DeviceUnavailable):
        return W.LoadFailed(key, str(exc), "device_unavailable")
    return W.LoadFailed(key, f"{type(exc).__name__}: {exc}")


def serve(config: WorkerSpec, preloaded: Preloaded) -> int:
    started = time.perf_counter()
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 1000)
    sock.setsockopt(zmq.IDENTITY, config.key.encode())
    sock.connect(config.manager)
    threads = ForwardThreads(config.threads)
    try:
        adapters = build_adapters(config, preloaded, threads)
    except Exception as exc:
        log.exception("worker %s failed to start", config.key)
        sock.send(W.encode(load_failed(config.key, exc)))
        sock.close()
        ctx.term()
        return 1
    sock.send(W.encode(W.Ready(config.key, os.getpid(), time.perf_counter() - started)))
    log.info("worker %s ready in %.2f s", config.key, time.perf_counter() - started)
    reported, reserve = (0, 0), Reserve()
    grammars = Grammars(preloaded.spare_tokenizer, adapters.engine.vocab_size)
    preparer = Preparer(ctx, lambda message: prepare(message, preloaded.spare_tokenizer,
                                                     preloaded.max_context, grammars))

    send = partial(_send, sock)
    intake = Intake()
    try:
        while _receive(sock, adapters, preloaded, threads, intake, preparer):
            busy = [engine for engine in adapters.engines() if engine.has_work()]
            for engine in busy:
                send(_step(engine, send))
            reserve.note(bool(busy))
            adapters.settle()
            if (adapters.loads, adapters.let_go) != reported:
                sock.send(W.encode(adapters.cache(config.key)))
                reported = (adapters.loads, adapters.let_go)
    finally:
        preparer.close()
        sock.close(0)
        ctx.term()
    return 0


def _receive(sock: zmq.Socket, adapters: Adapters, preloaded: Preloaded,
             threads: ForwardThreads, intake: Intake, preparer: Preparer | None = None) -> bool:
    """Handle the waiting messages and take the requests they brought (`intake`, kept across
    drains: a frame may bring thousands) one by one, for up to `DRAIN_S` while sequences
    decode or once a prompt to generate from is taken (its first token waits for the next
    step), and every request `preparer` has made ready (a `heavy` one is handed to it; without
    one, or a light one, is prepared here); False when told to stop."""
    engines = adapters.engines()
    timeout = 0 if intake or any(e.has_work() for e in engines) else 1000
    decoding = any(e.running or e.chunks.partials for e in engines)  # owed their next step
    budget_s = DRAIN_S if decoding else math.inf  # how long this drain may hold that step up
    poll = preparer.poller(sock).poll if preparer else sock.poll
    aborted: set[str] = set()  # taken out together, before the next other message is handled
    began = None  # when its first message was read
    while intake or poll(timeout):
        timeout, now = 0, time.perf_counter()
        began = now if began is None else began
        if now - began > budget_s:  # the rest after the next step
            break
        for prepared in preparer.ready() if preparer else []:
            _send(sock, _generate(prepared.message, adapters, preloaded, prepared))
        if not sock.poll(0):  # the messages first: an abort reaches the requests not yet taken
            if intake:
                request = intake.take()
                _take(request, sock, adapters, preloaded, preparer)
                if not (request.params.embed or request.params.count):
                    budget_s = DRAIN_S  # its first token is owed too
            continue
        try:
            message = W.decode(sock.recv())
        except msgspec.DecodeError:
            log.warning("undecodable message dropped")
            continue
        if isinstance(message, W.Stop):
            return False
        if isinstance(message, W.Abort):  # a run of them (each a request's prompts) goes together
            aborted.update(message.ids)
            _drop(aborted, intake, preparer)
            continue
        _abort(aborted, adapters)
        if isinstance(message, W.WorkerThreads):
            log.info("forwards on %d threads at most from now on", message.threads)
            threads.share = message.threads
        elif isinstance(message, W.Unload):
            adapters.unload(message.model)
        elif isinstance(message, W.Prefetch):
            try:
                adapters.route(message.model, message.adapter, message.tenant)
            except AdapterLoadError as exc:  # its first request will say so
                log.warning("prefetch of %s failed: %s", message.model, exc)
        elif isinstance(message, W.Generate | W.Generates):
            intake.extend(W.unframed(message))
    _abort(aborted, adapters)
    return True


def _take(message: W.Generate, sock: zmq.Socket, adapters: Adapters, preloaded: Preloaded,
          preparer: Preparer | None) -> None:
    if preparer is not None and heavy(message):
        preparer.submit(message)
    else:
        _send(sock, _generate(message, adapters, preloaded))


def _send(sock: zmq.Socket, events: list[W.Message]) -> None:
    if events:  # one frame
        sock.send(W.encode(W.framed(events)))


def _drop(request_ids: set[str], intake: Intake, preparer: Preparer | None) -> None:
    """The requests of these ids not taken yet are never taken (nor those being prepared)."""
    intake.drop(request_ids)
    for request_id in request_ids if preparer else ():
        preparer.drop(request_id)


def _abort(request_ids: set[str], adapters: Adapters) -> None:
    """The requests of these ids stop, in one pass over each engine's queues however many."""
    if request_ids:
        for engine in adapters.engines():
            engine.abort(request_ids)
        request_ids.clear()


def _generate(message: W.Generate, adapters: Adapters, preloaded: Preloaded,
              prepared: Prepared | None = None) -> list[W.Message]:
    """`message` to its engine (`prepared`: its prompt and constraint made beforehand; else
    its prompt now, and its constraint in the engine's checks)."""
    prepared = prepared or prepare(message, preloaded.tokenizer, preloaded.max_context)
    if prepared.failed is not None:
        return [prepared.failed]
    ids = prepared.ids
    if message.params.count:  # the prompt as it would run (template, tools, truncation)
        return [W.Started(message.id, len(ids)), W.Done(message.id, len(ids), 0)]
    fallback = False
    try:
        engine, adapter = adapters.route(message.model, message.adapter, message.tenant)
    except AdapterLoadError as exc:
        if not message.fallback:
            return [W.Failed(message.id, 503, "adapter_load_failed",
                             f"the model could not be loaded: {exc}")]
        log.warning("serving request %s with the base model: %s", message.id, exc)
        (engine, adapter), fallback = adapters.route(message.model, None), True
    prefill = None if fallback else adapters.prefill_of(message.model)
    request = Request(message.id, ids, message.params, fallback, grammar=prepared.matcher,
                      adapter=adapter, prefill=prefill, targets=message.targets,
                      token_targets=message.token_targets,
                      arrived=message.arrived or time.monotonic(), backend=adapters.backend,
                      tenant=message.tenant, group=message.group)
    return engine.add(request, message.max_context or None)


def _step(engine: InferenceEngine, emit: Emit) -> list[W.Message]:
    """A step's events (those before its decode step sent by `emit` at once), or its
    requests' failures."""
    try:
        return engine.step(emit)
    except ExecutorUnavailable as exc:
        return engine.fail_all(503, "executor_unavailable", str(exc))
    except ExecutorError as exc:
        return engine.fail_all(500, "executor_error", str(exc))
    except Exception as exc:  # a bug must not kill the worker silently
        log.exception("engine step failed")
        return engine.fail_all(500, "internal_error", f"{type(exc).__name__}")

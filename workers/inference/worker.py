"""One inference worker process: one tenant's base model and any of its adapters (`adapters`),
with their KV caches.

config -> build the base model -> Ready -> loop: drain messages, one step of each engine with
work, send events. The loop never blocks while an engine has work, so new requests join between
decode steps.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from typing import Any

import msgspec
import zmq

from wire import manager as W
from wire.call.messages import CallTargets
from wire.spawner import WorkerSpec
from workers.inference.adapters import AdapterLoadError, Adapters
from workers.inference.budget import Budget
from workers.inference.engine import InferenceEngine
from workers.inference.memory import Reserve
from workers.inference.pacing import Pacer
from workers.inference.request import Request
from workers.remote.handle import ExecutorError, ExecutorUnavailable
from workers.threads import ForwardThreads

log = logging.getLogger("workers.worker")

DEFAULT_CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


@dataclass
class Preloaded:
    """What the spawner loads once and every forked worker shares."""

    tokenizer: Any
    max_context: int
    eos_ids: tuple[int, ...]


def preload(base: str) -> Preloaded:
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig

    from catalogue.resolve import resolve_model

    path = resolve_model(base)
    tokenizer = AutoTokenizer.from_pretrained(path)
    if tokenizer.chat_template is None:
        tokenizer.chat_template = DEFAULT_CHAT_TEMPLATE
    config = AutoConfig.from_pretrained(path)
    eos: set[int] = set()
    try:
        generation = GenerationConfig.from_pretrained(path)
        ids = generation.eos_token_id
        eos.update(ids if isinstance(ids, list) else [ids] if ids is not None else [])
    except OSError:
        pass
    if tokenizer.eos_token_id is not None:
        eos.add(tokenizer.eos_token_id)
    context = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions",
                                                                          2048)
    return Preloaded(tokenizer, int(context), tuple(sorted(eos)))


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
    return Adapters(build_base(), make_engine, build_base, device=device, budget=budget)


def prompt_ids(message: W.Generate, tokenizer: Any, limit: int | None = None) -> list[int]:
    """The prompt's token ids; a chat with `truncate` loses its earliest messages (a first
    system message stays, and the last message) until it leaves room within `limit` for its
    max_tokens (for a server's default, one token)."""
    if message.prompt_ids is not None:
        return list(message.prompt_ids)
    if message.messages is not None:
        chat = [{"role": m.role, "content": m.content, **({"name": m.name} if m.name else {})}
                for m in message.messages]
        ids = _chat_ids(chat, tokenizer)
        params, first = message.params, int(bool(chat) and chat[0]["role"] == "system")
        need = 1 if params.fit or params.max_tokens is None else params.max_tokens
        if params.truncate and limit and len(ids) + need > limit and len(chat) - first > 1:
            return _truncated(chat, first, tokenizer, limit - need)
        return ids
    ids = tokenizer.encode(message.prompt or "")
    # an empty prompt generates "as if from the beginning of a new document" (OpenAI's words)
    return ids or [tokenizer.bos_token_id if tokenizer.bos_token_id is not None
                   else tokenizer.eos_token_id]


def _truncated(chat: list[dict], first: int, tokenizer: Any, room: int) -> list[int]:
    """The chat's ids without the fewest of its earliest messages (from `first`) that leave
    it within `room` tokens, or without all but its last (a prompt fewer messages make no
    longer: a binary search, a few renderings however long the chat)."""
    def without(k: int) -> list[int]:
        return _chat_ids(chat[:first] + chat[first + k:], tokenizer)

    low, high = 1, len(chat) - first - 1
    while low < high:
        middle = (low + high) // 2
        if len(without(middle)) <= room:
            high = middle
        else:
            low = middle + 1
    return without(low)


def _chat_ids(chat: list[dict], tokenizer: Any) -> list[int]:
    return list(tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=True,
                                              return_dict=False))


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
    try:
        while _receive(sock, adapters, preloaded, threads):
            busy = [engine for engine in adapters.engines() if engine.has_work()]
            for engine in busy:
                for event in _step(engine):
                    sock.send(W.encode(event))
            reserve.note(bool(busy))
            adapters.settle()
            if (adapters.loads, adapters.let_go) != reported:
                sock.send(W.encode(adapters.cache(config.key)))
                reported = (adapters.loads, adapters.let_go)
    finally:
        sock.close(0)
        ctx.term()
    return 0


def _receive(sock: zmq.Socket, adapters: Adapters, preloaded: Preloaded,
             threads: ForwardThreads) -> bool:
    """Handle every waiting message; False when told to stop."""
    timeout = 0 if any(e.has_work() for e in adapters.engines()) else 1000
    while sock.poll(timeout):
        timeout = 0
        try:
            message = W.decode(sock.recv())
        except msgspec.DecodeError:
            log.warning("undecodable message dropped")
            continue
        if isinstance(message, W.Stop):
            return False
        if isinstance(message, W.Abort):
            for engine in adapters.engines():
                engine.abort(message.id)
        elif isinstance(message, W.WorkerThreads):
            log.info("forwards on %d threads at most from now on", message.threads)
            threads.share = message.threads
        elif isinstance(message, W.Unload):
            adapters.unload(message.model)
        elif isinstance(message, W.Prefetch):
            try:
                adapters.route(message.model, message.adapter, message.tenant)
            except AdapterLoadError as exc:  # its first request will say so
                log.warning("prefetch of %s failed: %s", message.model, exc)
        elif isinstance(message, W.Generate):
            for event in _generate(message, adapters, preloaded):
                sock.send(W.encode(event))
    return True


def _generate(message: W.Generate, adapters: Adapters, preloaded: Preloaded) -> list[W.Message]:
    try:
        limit = min(preloaded.max_context, message.max_context or preloaded.max_context)
        ids = prompt_ids(message, preloaded.tokenizer, limit)
    except Exception as exc:
        return [W.Failed(message.id, 400, "invalid_prompt", str(exc))]
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
    request = Request(message.id, ids, message.params, fallback, adapter=adapter,
                      prefill=prefill, targets=message.targets,
                      token_targets=message.token_targets,
                      arrived=message.arrived or time.monotonic())
    return engine.add(request, message.max_context or None)
def _step(engine: InferenceEngine) -> list[W.Message]:
    try:
        return engine.step()
    except ExecutorUnavailable as exc:
        return engine.fail_all(503, "executor_unavailable", str(exc))
    except ExecutorError as exc:
        return engine.fail_all(500, "executor_error", str(exc))
    except Exception as exc:  # a bug must not kill the worker silently
        log.exception("engine step failed")
        return engine.fail_all(500, "internal_error", f"{type(exc).__name__}")

"""One inference worker process: one tenant's model (base or adapter) with its own KV cache.

config -> build the model -> Ready -> loop: drain messages, one engine step, send events. The
loop never blocks while the engine has work, so new requests join between decode steps.
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
from wire.spawner import WorkerSpec
from workers.inference.engine import InferenceEngine, Request
from workers.remote.handle import ExecutorError, ExecutorUnavailable

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


def build_model(config: WorkerSpec) -> tuple[Any, bool]:
    """(model, fallback): the adapter on the remote base, or the base alone if allowed."""
    import torch
    from peft import PeftModel

    from workers.device import claim_device
    from workers.remote.build import remote_model

    torch.set_num_threads(config.threads)
    device = claim_device(config.device)
    base = remote_model(config.base, config.executor, client_name=config.key,
                        privacy=config.privacy, device=str(device))
    if config.adapter_path is None:
        return base, False
    try:
        return PeftModel.from_pretrained(base, config.adapter_path,
                                         torch_device=str(device)).eval(), False
    except Exception:
        if not config.fallback:
            raise
        log.exception("adapter %s failed to load: serving the base model", config.adapter_path)
        return base, True


def prompt_ids(message: W.Generate, tokenizer: Any) -> list[int]:
    if message.prompt_ids is not None:
        return list(message.prompt_ids)
    if message.messages is not None:
        chat = [{"role": m.role, "content": m.content} for m in message.messages]
        return list(tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=True,
                                                  return_dict=False))
    ids = tokenizer.encode(message.prompt or "")
    # an empty prompt generates "as if from the beginning of a new document" (OpenAI's words)
    return ids or [tokenizer.bos_token_id if tokenizer.bos_token_id is not None
                   else tokenizer.eos_token_id]


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
    try:
        model, fallback = build_model(config)
    except Exception as exc:
        log.exception("worker %s failed to start", config.key)
        sock.send(W.encode(load_failed(config.key, exc)))
        sock.close()
        ctx.term()
        return 1
    engine = InferenceEngine(model, preloaded.tokenizer, max_context=preloaded.max_context,
                             eos_ids=preloaded.eos_ids, max_batch=config.max_batch,
                             kv_budget_bytes=config.kv_budget_bytes)
    sock.send(W.encode(W.Ready(config.key, os.getpid(), time.perf_counter() - started, fallback)))
    log.info("worker %s ready in %.2f s", config.key, time.perf_counter() - started)
    try:
        while _receive(sock, engine, preloaded, fallback):
            if engine.has_work():
                for event in _step(engine):
                    sock.send(W.encode(event))
    finally:
        sock.close(0)
        ctx.term()
    return 0


def _receive(sock: zmq.Socket, engine: InferenceEngine, preloaded: Preloaded,
             fallback: bool) -> bool:
    """Handle every waiting message; False when told to stop."""
    timeout = 0 if engine.has_work() else 1000
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
            engine.abort(message.id)
        elif isinstance(message, W.Generate):
            try:
                ids = prompt_ids(message, preloaded.tokenizer)
            except Exception as exc:
                sock.send(W.encode(W.Failed(message.id, 400, "invalid_prompt", str(exc))))
                continue
            request = Request(message.id, ids, message.params, fallback)
            for event in engine.add(request, message.max_context or None):
                sock.send(W.encode(event))
    return True


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

"""Embeddings: a prompt's last token's final hidden state (after the model's last norm), of
length 1, as decoder models serve embeddings (last-token pooling: vLLM's pooling of a generative
model, what E5-Mistral or Qwen3-Embedding are trained for), through the request's adapter.

Embedding requests wait in their engine's queue with the others (its adapters stay while they
do) and are answered at the start of its steps: at most `STEP_TOKENS` prompt tokens a step (a
longer prompt alone), prompts of one model and similar lengths in one left-padded forward
(`prefill.groups`), so the running sequences' decode steps go on between a large request's
forwards. A generation request behind one waits for it, as behind any other. An embedding
of NaN or infinity (broken adapter weights, an overflow) fails its request alone.
"""

from __future__ import annotations

import logging
from collections import deque
from typing import Any

import torch
from peft import PeftModel
from transformers import DynamicCache

from wire import manager as W
from workers.inference.prefill import groups, left_padded, shares_forwards
from workers.inference.request import Request
from workers.inference.rows import RowAdapters
from workers.inference.sequence import started
from workers.remote.handle import ExecutorError, ExecutorUnavailable

log = logging.getLogger("workers.engine")
STEP_TOKENS = 2048
NOT_FINITE = ("The model's embedding of this input is not finite (NaN or infinity): its "
              "adapter's weights, or the model's at this dtype, overflow.")


def answer_embeddings(waiting: deque[Request], model: Any, rows: RowAdapters,
                      device: torch.device) -> list[W.Message]:
    """Answer `waiting`'s embedding requests, in order, up to a step's tokens (each taken out
    of it); a forward that fails fails its requests only (where the executor is gone, every
    request taken waits again, at the front, for `fail_all`, and it is raised)."""
    asked = [r for r in waiting if r.params.embed]
    if not asked:
        return []
    taken: list[Request] = []
    events: list[W.Message] = []
    hidden, tokens = int(model.config.hidden_size), 0
    for request in asked:
        if request.params.dimensions > hidden:
            events.append(W.Failed(request.id, 400, "invalid_dimensions", f"dimensions is "
                                   f"{request.params.dimensions}: this model's embeddings have "
                                   f"{hidden}."))
        elif taken and tokens + len(request.prompt_ids) > STEP_TOKENS:
            break
        else:
            taken.append(request)
            tokens += len(request.prompt_ids)
    answered = {e.id for e in events} | {r.id for r in taken}
    removed = [r for r in waiting if r.id in answered]
    kept = [r for r in waiting if r.id not in answered]
    waiting.clear()
    waiting.extend(kept)
    for batch in batches(taken, model):
        try:
            vectors = last_states(batch[0].prefill or model, rows, batch, device)
        except ExecutorUnavailable:  # every answer of this step is lost with it: all wait again
            waiting.extendleft(reversed(removed))
            raise
        except Exception as exc:
            log.exception("an embedding forward of %d prompts failed", len(batch))
            code = "executor_error" if isinstance(exc, ExecutorError) else "internal_error"
            events += [W.Failed(r.id, 500, code, f"The request failed: {type(exc).__name__}")
                       for r in batch]
            continue
        finite = torch.isfinite(vectors).all(dim=1).tolist()
        encoded = embeddings(vectors, [r.params.dimensions for r in batch])
        for request, embedded, ok in zip(batch, encoded, finite, strict=True):
            if not ok:
                log.warning("request %s: its embedding is not finite", request.id)
                events.append(W.Failed(request.id, 500, "invalid_embedding", NOT_FINITE))
                continue
            events += [started(request),
                       W.Done(request.id, len(request.prompt_ids), 0, embedded)]
    return events


def batches(requests: list[Request], model: Any) -> list[list[Request]]:
    """The requests that share a forward: of the engine's model (not prompt or prefix tuning's
    own) and similar lengths; the others alone."""
    if not shares_forwards(model):
        return [[r] for r in requests]
    alone = [[r] for r in requests if r.prefill is not None]
    shared = [r for r in requests if r.prefill is None]
    return [[shared[i] for i in group] for group in groups([len(r.prompt_ids) for r in shared])
            ] + alone


def last_states(model: Any, rows: RowAdapters, requests: list[Request],
                device: torch.device) -> torch.Tensor:
    """[prompts, hidden]: each prompt's last position's output of the model's decoder (after
    its final norm), from one forward of the prompts left-padded, each row through its adapter:
    of the decoder alone (no head, no logits), or for prompt or prefix tuning of its model's
    own forward (which places the virtual tokens), read where the decoder returns."""
    ids, mask, positions = left_padded([r.prompt_ids for r in requests], device)
    # one prompt goes without positions: prompt tuning's PeftModel places its virtual tokens
    extra = {} if len(requests) == 1 else {"position_ids": positions}
    base = model.get_base_model() if isinstance(model, PeftModel) else model
    with torch.no_grad(), rows.select([r.adapter for r in requests]):
        if shares_forwards(model):  # the decoder alone: no head, no logits
            return base.get_decoder()(input_ids=ids, attention_mask=mask, use_cache=False,
                                      **extra).last_hidden_state[:, -1].float().cpu()
        captured: list[torch.Tensor] = []  # prompt or prefix tuning: its model's own forward
        hook = base.get_decoder().register_forward_hook(
            lambda module, args, out: captured.append(out[0][:, -1]))
        try:
            model(input_ids=ids, attention_mask=mask, past_key_values=DynamicCache(),
                  use_cache=True, logits_to_keep=1, **extra)
        finally:
            hook.remove()
    return captured[-1].float().cpu()


def embeddings(states: torch.Tensor, dimensions: list[int]) -> list[bytes]:
    """Hidden states [rows, hidden] as embeddings: each row's first `dimensions` (all where 0),
    of length 1, as float32 little-endian bytes (rows asking the same `dimensions` normalized
    together, not a few tensor ops each)."""
    encoded = [b""] * len(dimensions)
    for width in set(dimensions):
        rows = [i for i, asked in enumerate(dimensions) if asked == width]
        kept = states[rows, :width] if width else states[rows]
        unit = torch.nn.functional.normalize(kept, dim=1).numpy().astype("<f4")
        for row, vector in zip(rows, unit, strict=True):
            encoded[row] = vector.tobytes()
    return encoded

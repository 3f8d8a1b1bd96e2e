"""Continuous batching over one worker's requests.

`step()` first answers waiting embedding requests (`embedding.py`), admits waiting requests (in
turns, flex ones last and within their seats: `fair.py`; prefilled together in one forward where
they can share it, `prefill.py`, through the PEFT model, which also handles the virtual tokens
of prompt and prefix tuning; a long prompt beside running sequences a chunk a step,
`chunks.py`), then runs one decode step for all running sequences at once (through the
underlying model, left-padded batch cache, each row attending from its own first position,
`row_attention.py`; the step's chunks and short prompts beside running rows in one forward where
it can, `packed.py`): requests join and leave between steps.
An engine that `use`s a PeftModel of many LoRA adapters runs every phase through it.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Collection
from typing import Any

import torch
from peft import PeftModel

from wire import manager as W
from workers.inference.batch import BatchCache, kv_bytes_per_token, place, repeat_rows
from workers.inference.checks import refusal
from workers.inference.chunks import Chunker, Partial, prefill_chunk
from workers.inference.detok import Detokenizer
from workers.inference.embedding import answer_embeddings
from workers.inference.fair import FairQueue
from workers.inference.grammar import Grammars
from workers.inference.packed import may_pack, packs, step_forward
from workers.inference.prefill import Prefilled, prefill_one, prefill_shared, shares_forwards
from workers.inference.request import Request
from workers.inference.row_attention import call_bytes, install, plan
from workers.inference.rows import RowAdapters
from workers.inference.sampling import Choice, GreedyRows, choose, make_generator
from workers.inference.sequence import Sequence, started
from workers.remote.handle import ExecutorError, ExecutorUnavailable, flex_step
from workers.remote.tail import Choosing, tail_of

log = logging.getLogger("workers.engine")
Emit = Callable[[list[W.Message]], None]  # sends a step's events before its decode step


class InferenceEngine:
    def __init__(self, model: Any, tokenizer: Any, *, max_context: int, eos_ids: tuple[int, ...],
                 max_batch: int = 32, kv_budget_bytes: int = 0,
                 pace: Callable[[list[Request], list[Request]], None] | None = None,
                 chunk_tokens: int = 0, attention_call_bytes: int | None = None,
                 pack: bool = True) -> None:
        self.prefill_model = model
        self.decode_model = model.get_base_model() if isinstance(model, PeftModel) else model
        self.tail = tail_of(self.decode_model)  # the same modules whichever model runs them
        self.by_rows = install(self.decode_model)  # decode by runs of rows: row_attention.py
        self.packs = pack and self.by_rows  # prompts in the rows' decode forward: packed.py
        self.tokenizer, self.max_context, self.eos_ids = tokenizer, max_context, eos_ids
        self.max_batch = max_batch
        self.vocab_size, self.device = int(model.config.vocab_size), model.device
        self.kv_budget_bytes = kv_budget_bytes  # KV cache kept on the device; 0: no limit
        self.kv_token_bytes = kv_bytes_per_token(model.config, model.dtype)
        cost = call_bytes(self.device) if attention_call_bytes is None else attention_call_bytes
        self.call_positions = cost * model.config.num_hidden_layers // self.kv_token_bytes
        self.grammars = Grammars(tokenizer, self.vocab_size)
        self.waiting = FairQueue()  # tenants' requests take turns (a shared worker's)
        self.chunks = Chunker(chunk_tokens)  # long prompts coming in beside running sequences
        self.resident = BatchCache(self.device)
        self.offloaded = BatchCache(self.device, offloaded=True)
        self._pending: dict[str, int] = {}  # request id -> sequences still running
        self._generated: dict[str, int] = {}  # request id -> tokens generated so far
        self.rows = RowAdapters()  # which adapter each row goes through
        self.pace = pace  # before a step, given its admitted and decoded requests: its calls' waits

    def use(self, model: Any, mixed: bool) -> None:
        """From now on, run every phase through `model`: a PeftModel of LoRA adapters wrapping
        this engine's model (`mixed`: each row names its adapter, or the base model), or the
        plain model again once it holds none."""
        self.prefill_model = self.decode_model = model
        self.rows.close()
        self.rows = RowAdapters(model if mixed else None)

    def adapters_in_use(self) -> set[str]:
        """The adapters that serve a waiting, prefilling or running request."""
        return {r.adapter for r in [*self.waiting, *self.chunks.requests]} | \
            {s.request.adapter for s in self.running}

    @property
    def running(self) -> list[Sequence]:
        return self.resident.sequences + self.offloaded.sequences

    def has_work(self) -> bool:
        return bool(self.waiting or self.chunks.partials or self.running)

    def add(self, request: Request, max_context: int | None = None) -> list[W.Message]:
        limit = min(self.max_context, max_context or self.max_context)
        refused = refusal(request, limit, self.vocab_size, self.max_batch, self.grammars)
        if refused is None:
            self.waiting.add(request)  # an embedding too (`embedding.py`)
        return [] if refused is None else [refused]

    def abort(self, request_ids: Collection[str]) -> None:
        self.waiting.drop(request_ids)
        self.chunks.drop(request_ids)
        for seq in self.running:
            if seq.request.id in request_ids:
                seq.finish = "abort"
        self._drop_finished()
        for request_id in request_ids:
            self._forget(request_id)

    def _forget(self, request_id: str) -> None:
        self._pending.pop(request_id, None)
        self._generated.pop(request_id, None)

    def fail_all(self, status: int, code: str, message: str) -> list[W.Message]:
        ids = {r.id for r in [*self.waiting, *self.chunks.requests]} | \
            {s.request.id for s in self.running}
        self.waiting.clear()
        self.chunks.partials.clear()
        self.resident = BatchCache(self.device)
        self.offloaded = BatchCache(self.device, offloaded=True)
        self._pending, self._generated = {}, {}
        return [W.Failed(i, status, code, message) for i in sorted(ids)]

    def step(self, emit: Emit | None = None) -> list[W.Message]:
        """One step's events; with `emit`, those before its decode step go to it first (a new
        request's first token is not held for the running sequences' next)."""
        self.waiting.settle()  # each tenant's places go round its requests (`fair.py`)
        running = [s.request for s in self.running]  # a worker's flex work yields (`fair.py`)
        with flex_step(self.waiting.flex_only(running, self.chunks.requests)):
            return self._step(running, emit)

    @torch.no_grad()
    def _step(self, running: list[Request], emit: Emit | None) -> list[W.Message]:
        events = answer_embeddings(self.waiting, self.prefill_model, self.rows, self.device)
        admitted = self.waiting.seat(running, self.chunks.requests, self.max_batch)
        chunks = self.chunks.plan(admitted, running, self.packs and may_pack(
            self.resident.sequences, self.rows)) if shares_forwards(self.prefill_model) \
            else []  # prompt or prefix tuning's virtual tokens go in front of each forward
        if self.pace is not None:  # a prompt's first token comes in the step of its last chunk
            self.pace([*admitted, *(p.request for p, n in chunks if n == p.rest)], running)
        try:
            events += self._prefill_all(admitted)
            packed = chunks if self.packs and all(
                packs(p.request, self.resident.sequences, self.rows) for p, _ in chunks) else []
            events += self._prefill_chunks([] if packed else chunks)
        except ExecutorUnavailable:
            self.waiting.extendleft(reversed(admitted))  # every request fails with the executor
            raise
        if emit is not None and events:
            emit(events)
            events = []
        began, threads, tried = time.perf_counter(), 0, bool(packed)
        for batch in (self.resident, self.offloaded):
            if batch.sequences:
                events += self._decode(batch, packed if batch is self.resident else [])
                threads = threads or torch.get_num_threads()  # the forward the chunks were in
        if packed:  # the step's time: a decode step's and the chunks' tokens'
            self.chunks.budget.observe_prefill(time.perf_counter() - began,
                                               sum(take for _, take in packed), threads)
        elif running and not tried:  # a packed step that failed is neither step's cost
            self.chunks.budget.observe_decode(time.perf_counter() - began)
        return events

    def _prefill_all(self, admitted: deque[Request]) -> list[W.Message]:
        """Prefill the admitted requests, each removed from `admitted` once done: together
        where they can share a forward, else alone; a failure fails its request only."""
        together = [r for r in admitted if not r.params.echo and r.prefill is None] \
            if not self.kv_budget_bytes and shares_forwards(self.prefill_model) else []
        shared = prefill_shared(self.prefill_model, self.rows, together, self.device,
                                self.chunks.budget.observe_prefill)
        events: list[W.Message] = []
        while admitted:
            request = admitted[0]
            try:
                done = shared.get(id(request))
                events += self._prefill(request) if done is None else self._admit(
                    request, started(request), done)
            except ExecutorUnavailable:
                raise
            except Exception as exc:
                events.append(self._failed(request, exc))
            admitted.popleft()
        return events

    def _prefill_chunks(self, chunks: list[tuple[Partial, int]]) -> list[W.Message]:
        """The step's chunks of prompts coming in by chunks; a prompt all in joins the running
        sequences with its first token; a failure fails its request only."""
        events: list[W.Message] = []
        for partial, tokens in chunks:
            request, began = partial.request, time.perf_counter()
            try:
                done = prefill_chunk(self.prefill_model, self.rows, partial, tokens, self.device)
                self.chunks.budget.observe_prefill(time.perf_counter() - began, tokens)
                if done is not None:
                    events += self._all_in(request, done)
            except ExecutorUnavailable:
                raise
            except Exception as exc:
                self.chunks.drop({request.id})
                events.append(self._failed(request, exc))
        return events

    def _failed(self, request: Request, exc: Exception) -> W.Failed:
        log.exception("request %s failed in prefill", request.id)
        self._forget(request.id)
        code = "executor_error" if isinstance(exc, ExecutorError) else "internal_error"
        return W.Failed(request.id, 500, code, f"The request failed: {type(exc).__name__}")

    def _prefill(self, request: Request) -> list[W.Message]:
        params = request.params
        want_prompt_logprobs = params.echo and params.logprobs is not None
        model = self.prefill_model if request.prefill is None else request.prefill
        began = time.perf_counter()
        done = prefill_one(model, self.rows, request.prompt_ids, request.adapter, self.device,
                           want_prompt_logprobs)
        self.chunks.budget.observe_prefill(  # every position's logits cost more than a token
            time.perf_counter() - began, 0 if want_prompt_logprobs else len(request.prompt_ids))
        return self._admit(request, started(request, self.tokenizer, done.logits), done)

    def _all_in(self, request: Request, done: Prefilled) -> list[W.Message]:
        """A prompt that came in by chunks, all in: it joins the running sequences."""
        self.chunks.drop({request.id})
        return self._admit(request, started(request), done)

    def _admit(self, request: Request, first: W.Started, done: Prefilled) -> list[W.Message]:
        """A prefilled request's first tokens, and its sequences into the decode batch."""
        params = request.params
        events: list[W.Message] = [first]
        if params.max_tokens == 0:
            return [*events, *(W.Delta(request.id, i, "", None, "length") for i in range(params.n)),
                    W.Done(request.id, len(request.prompt_ids), 0)]
        sequences = []
        self._generated[request.id] = 0
        for index in range(params.n):
            seq = Sequence(request, index, Detokenizer(self.tokenizer, params.stop),
                           make_generator(params, index),
                           request.grammar.deep_copy() if request.grammar else None)
            events += self._accept(seq, self._choose(seq, done.last_logits))
            sequences.append(seq)
        self._pending[request.id] = params.n
        batch = place(request, self.resident, self.offloaded, self.kv_budget_bytes,
                      self.kv_token_bytes)
        batch.join(repeat_rows(done.kv, params.n), done.mask.repeat(params.n, 1))
        batch.sequences.extend(sequences)
        return events + self._drop_finished()

    def _decode(self, batch: BatchCache, packed: list[tuple[Partial, int]]) -> list[W.Message]:
        """A decode step of the batch's rows, with the chunks `packed` in its forward (a
        prompt all in joins the rows); where that forward fails, each chunk goes alone first
        (a failure then stays its request's), `packed` emptied: its time is no chunk's cost."""
        groups = plan(batch.starts, self.call_positions) if self.by_rows else ()
        greedy = GreedyRows(batch.sequences, self.eos_ids)
        try:  # rows that all take their greedy choice want no logits (`Choosing`)
            with Choosing(self.tail, all(greedy.rows) and not packed, greedy.settle) as chosen:
                logits, done = step_forward(self.decode_model, self.rows, batch, groups, packed,
                                            self.device)
        except ExecutorUnavailable:
            raise
        except Exception:
            if not packed:
                raise
            log.exception("a decode step with %d chunks failed: each goes alone", len(packed))
            alone, packed[:] = packed[:], []
            return self._prefill_chunks(alone) + self._decode(batch, [])
        best = chosen.ids if chosen.ids is not None else greedy.choices(logits)
        events = [delta for row, seq in enumerate(batch.sequences) for delta in self._accept(
            seq, Choice(best[row]) if greedy.rows[row] else self._choose(seq, logits[row]))]
        events += self._drop_finished()
        for (partial, _), prefilled in zip(packed, done, strict=True):
            events += [] if prefilled is None else self._all_in(partial.request, prefilled)
        return events

    def _choose(self, seq: Sequence, logits: torch.Tensor) -> Choice:
        allowed = None if seq.matcher is None else self.grammars.allowed(seq.matcher)
        return choose(logits, seq.request.params, seq.counts, seq.generator,
                      seq.allows_eos(), self.eos_ids, allowed)

    def _accept(self, seq: Sequence, choice: Choice) -> list[W.Delta]:
        self._generated[seq.request.id] = self._generated.get(seq.request.id, 0) + 1
        return seq.accept(choice, self.eos_ids, self.tokenizer)

    def _drop_finished(self) -> list[W.Message]:
        events: list[W.Message] = []
        for batch in (self.resident, self.offloaded):
            keep = [row for row, seq in enumerate(batch.sequences) if not seq.finish]
            if len(keep) == len(batch.sequences):
                continue
            for seq in batch.sequences:
                if seq.finish and seq.finish != "abort" and seq.request.id in self._pending:
                    self._pending[seq.request.id] -= 1
                    if self._pending[seq.request.id] == 0:
                        del self._pending[seq.request.id]
                        events.append(W.Done(seq.request.id, len(seq.request.prompt_ids),
                                             self._generated.pop(seq.request.id, 0)))
            batch.keep(keep)
        return events


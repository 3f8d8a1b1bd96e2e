"""Long-context decode for our benchmark client: one request at a time with a long prompt,
through the inference worker's own engine (`workers.inference.engine`) on the remote model, so
its KV cache stays on the client's device within `kv_budget_bytes` (0: no limit) and is
offloaded to host memory past it, as a worker's would be. (Plain runs transformers' generate(),
`bench.loops.decode` with `first=False`.) Both report the gaps between decode steps only: a
round's first token also pays the prefill of the whole context, which is not what the cache's
placement changes. Also: long prompts arriving beside running sequences (`beside_rounds`), and
one batch of prompts of different lengths decoding together (`lengths_rounds`, plain:
`padded_rounds`).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable

import torch


def engine_rounds(model, tokenizer, context: int, tokens: int, until: float,
                  rng: torch.Generator, kv_budget_bytes: int) -> tuple[list[float], float, int]:
    """Engine rounds until the window closes: the per-step gaps after the prefill step, when
    the last step ended, and the most rows its offloaded batch held (0: it never offloaded)."""
    from workers.inference.engine import InferenceEngine

    engine = InferenceEngine(model.eval(), tokenizer, max_context=context + tokens, eos_ids=(),
                             max_batch=1, kv_budget_bytes=kv_budget_bytes)
    gaps: list[float] = []
    offloaded, last = 0, time.monotonic()

    def watch() -> None:
        nonlocal offloaded
        offloaded = max(offloaded, engine.offloaded.rows)

    for round_ in itertools.count():
        if time.monotonic() >= until:
            break
        prompt = torch.randint(0, 50000, (context,), generator=rng).tolist()
        stamps = serve_round(engine, f"long-{round_}", [prompt], tokens, until, watch)
        gaps += [b - a for a, b in itertools.pairwise(stamps)]
        last = stamps[-1]
    return gaps, last, offloaded


def serve_round(engine, name: str, prompts: list[list[int]], tokens: int, until: float,
                watch: Callable[[], None] = lambda: None) -> list[float]:
    """`prompts` added together (greedy, `tokens` tokens each) and served to their end, or
    aborted once the window closes: when each step ended (`watch` called after each). A
    refusal or a failure stops the client with its reason."""
    from wire import manager as W
    from workers.inference.request import Request

    ids = [f"{name}-{row}" for row in range(len(prompts))]
    for request_id, prompt in zip(ids, prompts, strict=True):
        refused = engine.add(Request(request_id, prompt,
                                     W.SamplingParams(max_tokens=tokens, temperature=0)))
        if refused:
            raise RuntimeError(f"the engine refused a request: {refused[0].message}")
    stamps: list[float] = []
    while engine.has_work():
        failed = [e for e in engine.step() if isinstance(e, W.Failed)]
        if failed:
            raise RuntimeError(f"request {failed[0].id} failed: {failed[0].message}")
        stamps.append(time.monotonic())
        watch()
        if stamps[-1] >= until:
            for request_id in ids:
                engine.abort({request_id})
    return stamps


QUIET_STEPS = 16  # decode steps between one long prompt's end and the next one's arrival


def beside_rounds(model, tokenizer, prompt: int, running: int, until: float,
                  rng: torch.Generator, chunk_tokens: int, served: int = 0,
                  pack: bool = True) -> tuple[list[float], float, dict]:
    """`running` sequences decode while long prompts (`prompt` tokens, each asking 2 tokens)
    arrive one at a time, each QUIET_STEPS steps after the one before ended, through the
    worker's own engine: the gaps between the running sequences' tokens (every step gives each
    one), when the last step ended, and each arrival's time to its first token. `chunk_tokens`
    as a worker's (0: sized from what it measures); `pack` False: chunks in forwards of their
    own beside the rows' decode step (the engine before packed steps). Runs past `until` until
    `served` long prompts are done (a warm-up's: the process has then held a joined batch's
    cache once, as a worker that has run a while has)."""
    from wire import manager as W
    from workers.inference.engine import InferenceEngine
    from workers.inference.request import Request

    engine = InferenceEngine(model.eval(), tokenizer, max_context=prompt + 4096, eos_ids=(),
                             chunk_tokens=chunk_tokens, pack=pack)
    for row in range(running):
        engine.add(Request(f"running-{row}", torch.randint(0, 50000, (16,), generator=rng)
                           .tolist(), W.SamplingParams(max_tokens=4000, temperature=0)))
    engine.step()
    gaps: list[float] = []
    firsts: list[float] = []
    current, arrived, quiet, last = None, 0.0, 0, time.monotonic()
    for count in itertools.count():
        if time.monotonic() >= until and len(firsts) >= served:
            break
        quiet = quiet + 1 if current is None else 0
        if quiet > QUIET_STEPS:
            current, quiet = f"long-{count}", 0
            ids = torch.randint(0, 50000, (prompt,), generator=rng).tolist()
            engine.add(Request(current, ids, W.SamplingParams(max_tokens=2, temperature=0)))
            arrived = time.monotonic()
        events = engine.step()
        now = time.monotonic()
        gaps.append(now - last)
        last = now
        for event in events:
            if isinstance(event, W.Failed):
                raise RuntimeError(f"request {event.id} failed: {event.message}")
            if event.id == current and isinstance(event, W.Started):
                firsts.append(now - arrived)
            if event.id == current and isinstance(event, W.Done):
                current = None
    return gaps, last, {"first_tokens": firsts}


def mixed_prompts(long: int, short: int, rows: int, rng: torch.Generator) -> list[list[int]]:
    """One prompt of `long` tokens and `rows` - 1 of `short`."""
    return [torch.randint(0, 50000, (n,), generator=rng).tolist()
            for n in (long, *[short] * (rows - 1))]


def lengths_rounds(model, tokenizer, prompts: list[list[int]], tokens: int, until: float,
                   call_bytes: int | None = None) -> tuple[list[float], float]:
    """Rounds of one batch of `prompts` (arriving together) decoding `tokens` tokens each
    through the worker's own engine (`call_bytes`: what it counts an attention call to cost;
    None: as a worker): the gaps between decode steps after the first step (which also
    prefills), and when the last step ended."""
    from workers.inference.engine import InferenceEngine

    engine = InferenceEngine(model.eval(), tokenizer, eos_ids=(), attention_call_bytes=call_bytes,
                             max_context=max(map(len, prompts)) + tokens)
    gaps: list[float] = []
    last = time.monotonic()
    for round_ in itertools.count():
        if time.monotonic() >= until:
            break
        stamps = serve_round(engine, str(round_), prompts, tokens, until)
        gaps += [b - a for a, b in itertools.pairwise(stamps)]
        last = stamps[-1]
    return gaps, last


def padded_rounds(model, prompts: list[list[int]], tokens: int,
                  until: float) -> tuple[list[float], float]:
    """The same rounds through plain generate(): `prompts` left-padded into one batch."""
    from transformers import StoppingCriteriaList

    from bench.loops import TokenClock
    from bench.models import FIXED_LENGTH

    width = max(map(len, prompts))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts], device=model.device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts],
                        device=model.device)
    clock, gaps = TokenClock(until), []
    model.eval()
    while time.monotonic() < until:
        clock.stamps = [time.monotonic()]
        with torch.no_grad():
            model.generate(input_ids=ids, attention_mask=mask, do_sample=False, pad_token_id=0,
                           max_new_tokens=tokens, **FIXED_LENGTH,
                           stopping_criteria=StoppingCriteriaList([clock]))
        gaps += [b - a for a, b in itertools.pairwise(clock.stamps[1:])]  # after the prefill's
    return gaps, clock.last

"""Long-context decode for our benchmark client: one request at a time with a long prompt,
through the inference worker's own engine (`workers.inference.engine`) on the remote model, so
its KV cache stays on the client's device within `kv_budget_bytes` (0: no limit) and is
offloaded to host memory past it, as a worker's would be. (Plain runs transformers' generate(),
`bench.workload.decode` with `first=False`.) Both report the gaps between decode steps only: a
round's first token also pays the prefill of the whole context, which is not what the cache's
placement changes.
"""

from __future__ import annotations

import itertools
import time

import torch


def engine_rounds(model, tokenizer, context: int, tokens: int, until: float,
                  rng: torch.Generator, kv_budget_bytes: int) -> tuple[list[float], float, int]:
    """Engine rounds until the window closes: the per-step gaps after the prefill step, when
    the last step ended, and the most rows its offloaded batch held (0: it never offloaded)."""
    from wire import manager as W
    from workers.inference.engine import InferenceEngine
    from workers.inference.request import Request

    engine = InferenceEngine(model.eval(), tokenizer, max_context=context + tokens, eos_ids=(),
                             max_batch=1, kv_budget_bytes=kv_budget_bytes)
    gaps: list[float] = []
    offloaded, last, round_ = 0, time.monotonic(), 0
    while time.monotonic() < until:
        prompt = torch.randint(0, 50000, (context,), generator=rng).tolist()
        request = Request(f"long-{round_}", prompt, W.SamplingParams(max_tokens=tokens,
                                                                     temperature=0))
        failed = [e for e in engine.add(request) if isinstance(e, W.Failed)]
        if failed:
            raise RuntimeError(f"the engine refused the request: {failed[0].message}")
        stamps = []
        while engine.has_work():
            for event in engine.step():
                if isinstance(event, W.Failed):
                    raise RuntimeError(f"the request failed: {event.message}")
            stamps.append(time.monotonic())
            offloaded = max(offloaded, engine.offloaded.rows)
            if stamps[-1] >= until:
                engine.abort(request.id)
        gaps += [b - a for a, b in itertools.pairwise(stamps)]
        last, round_ = stamps[-1], round_ + 1
    return gaps, last, offloaded

"""Ours with several tenants in one process: a worker of the shared pool (`--shared-tenants`),
its adapters and engine (`workers/inference/adapters.py`, the real classes) on the run's
executor, each row of a batch with its own tenant's LoRA adapter. The counterpart of one peft
process decoding mixed-adapter batches (`bench.loops.decode_mixed`): neither isolates its
tenants from each other."""

from __future__ import annotations

import time
from pathlib import Path

import torch
from peft import get_peft_model
from transformers import AutoTokenizer

from bench.models import RANKS, adapter, as_worker
from catalogue.resolve import resolve_model
from wire import manager as W


class SharedWorker:
    """`n` LoRA adapters (ranks 8-64, seeded) written under `root` and made resident in one
    worker's adapters; `decode` serves one request an adapter at once, round after round."""

    def __init__(self, model: str, executor, n: int, root: Path, device: str = "cpu") -> None:
        from workers.inference.adapters import Adapters
        from workers.inference.budget import Budget
        from workers.inference.engine import InferenceEngine
        from workers.remote.build import remote_model

        def base():
            return as_worker(remote_model(model, executor, client_name="bench-shared",
                                          device=device))

        tokenizer = AutoTokenizer.from_pretrained(resolve_model(model))
        self.paths = write_adapters(base(), root, n)
        shared = base()
        self.symbiosis_executor = shared.symbiosis_executor  # its calls are counted
        self.adapters = Adapters(shared, lambda m: InferenceEngine(
            m, tokenizer, max_context=2048, eos_ids=(), max_batch=32), base,
            budget=Budget(max(32, n)))
        for path in self.paths:  # resident before the window: decode is measured, not loading
            self.adapters.route(str(path), W.AdapterRef(str(path), "LORA"))
        self.prompts: dict[str, list[int]] = {}  # the last round's requests: prompt, text
        self.texts: dict[str, str] = {}
        self._rounds = 0

    def decode(self, prompt: int, tokens: int, until: float,
               rng: torch.Generator) -> tuple[list[float], float]:
        """Rounds of one request an adapter until the window closes (the round then running is
        cut short, as generate() is): the gap before each token of each request, and when the
        last step ended."""
        latencies, last = [], time.monotonic()
        while last < until:
            latencies += self.serve_round(prompt, tokens, until, rng)
            last = time.monotonic()
        return latencies, last

    def serve_round(self, prompt: int, tokens: int, until: float,
                    rng: torch.Generator) -> list[float]:
        """One request an adapter, added at once and stepped together until done (or the window
        closes): the gap before each token of each request."""
        from workers.inference.request import Request

        self._rounds += 1
        self.prompts, self.texts, engines = {}, {}, set()
        params = W.SamplingParams(max_tokens=tokens, temperature=0, ignore_eos=True)
        for k, path in enumerate(self.paths):
            engine, name = self.adapters.route(str(path), W.AdapterRef(str(path), "LORA"))
            request_id = f"{self._rounds}-{k}"
            ids = torch.randint(0, 50000, (prompt,), generator=rng).tolist()
            self.prompts[request_id], self.texts[request_id] = ids, ""
            refused = engine.add(Request(request_id, ids, params, adapter=name,
                                         prefill=self.adapters.prefill_of(str(path))))
            if refused:
                raise RuntimeError(f"a shared worker refused a request: {refused[0]}")
            engines.add(engine)
        latencies, last = [], time.monotonic()
        while any(engine.has_work() for engine in engines):
            if last >= until:
                for engine in engines:
                    for request_id in self.texts:
                        engine.abort({request_id})
                break
            events = [e for engine in engines if engine.has_work() for e in engine.step()]
            now = time.monotonic()
            for event in events:
                if isinstance(event, W.Failed):
                    raise RuntimeError(f"a shared worker's request failed: {event.message}")
                if isinstance(event, W.Delta):
                    self.texts[event.id] += event.text
                    latencies.append(now - last)
            last = now
            self.adapters.settle()
        return latencies


def write_adapters(base, root: Path, n: int) -> list[Path]:
    """n LoRA adapters on q/v (ranks 8-64 in turn, B seeded random so that each row's delta is
    its own), saved as peft saves them: root/a0 ... root/a{n-1}."""
    torch.manual_seed(0)
    names = [f"a{i}" for i in range(n)]
    model = get_peft_model(base, adapter("lora", RANKS[0]), adapter_name=names[0])
    for i, name in enumerate(names[1:], start=1):
        model.add_adapter(name, adapter("lora", RANKS[i % len(RANKS)]))
    with torch.no_grad():
        for key, param in model.named_parameters():
            if ".lora_B." in key:
                param.normal_(std=0.02)
    model.save_pretrained(root, selected_adapters=names)
    return [root / name for name in names]

"""The two sides of the many-adapters scenarios (13): one worker's adapters and engines on the
shared executor (`Ours`), and one plain peft process holding every adapter (`plain_holding`);
adapters to serve, and what each side's speed and memory are measured with."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import psutil
import torch
from peft import PeftModel, get_peft_model
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

from bench.models import adapter, as_worker
from bench.peft_process import PeftProcess, holding
from catalogue.resolve import resolve_model
from wire import manager as W

MODEL = "tiny-llama"
RANK = 8
RESIDENT = 32
TOKENS = 8
IN_FLIGHT = 4


def make_adapters(root: Path, n: int, method: str = "lora") -> list[Path]:
    """n adapters (LoRA r8, or IA3): one made by peft (its config and tensor names), the others
    seeded random tensors of the same shapes (as many files as a thousand fine-tuning jobs would
    leave)."""
    torch.manual_seed(0)
    first = root / "a0"
    get_peft_model(AutoModelForCausalLM.from_pretrained(resolve_model(MODEL)),
                   adapter(method, RANK)).save_pretrained(first)
    around = 1.0 if method == "ia3" else 0.0  # IA3 scales: near one
    shapes = {k: v.shape for k, v in load_file(first / "adapter_model.safetensors").items()}
    paths = [first]
    for i in range(1, n):
        path = root / f"a{i}"
        path.mkdir()
        shutil.copy(first / "adapter_config.json", path)
        generator = torch.Generator().manual_seed(i)
        save_file({k: around + 0.05 * torch.randn(s, generator=generator)
                   for k, s in shapes.items()},
                  path / "adapter_model.safetensors")
        paths.append(path)
    return paths


class Ours:
    """One worker's adapters and engines, served in a closed loop of `IN_FLIGHT` requests."""

    def __init__(self, endpoint: str, tokenizer, capacity: int = RESIDENT) -> None:
        from workers.inference.adapters import Adapters
        from workers.inference.budget import Budget
        from workers.inference.engine import InferenceEngine
        from workers.remote.build import remote_model

        def engine(model):
            return InferenceEngine(model, tokenizer, max_context=2048, eos_ids=(), max_batch=32)

        def base():
            return as_worker(remote_model(MODEL, endpoint, client_name="bench-adapters"))

        self.adapters = Adapters(base(), engine, base, budget=Budget(capacity))
        self.cold_ms: list[float] = []

    def add(self, request_id: str, path: Path, prompt: list[int], tokens: int = TOKENS) -> None:
        from workers.inference.request import Request

        cold = str(path) not in self.adapters.loaded
        started = time.perf_counter()
        engine, name = self.adapters.route(str(path), W.AdapterRef(str(path), "LORA"))
        if cold:
            self.cold_ms.append(1e3 * (time.perf_counter() - started))
        params = W.SamplingParams(max_tokens=tokens, temperature=0, ignore_eos=True)
        assert engine.add(Request(request_id, prompt, params, adapter=name,
                                  prefill=self.adapters.prefill_of(str(path)))) == []

    def step(self) -> list[str]:
        """One step of each engine; the requests that finished (a failure raises)."""
        done = []
        for engine in self.adapters.engines():
            for event in engine.step() if engine.has_work() else []:
                assert not isinstance(event, W.Failed), event
                if isinstance(event, W.Done):
                    done.append(event.id)
        self.adapters.settle()
        return done

    def drain(self) -> None:
        while any(engine.has_work() for engine in self.adapters.engines()):
            self.step()


def plain_holding(paths: list[Path]) -> PeftModel:
    """One peft model holding every adapter, in this process (the Zipf and memory rows)."""
    return holding(str(resolve_model(MODEL)), [str(p) for p in paths])


def uss() -> int:
    return psutil.Process().memory_full_info().uss


def best_speeds(ours: Ours, paths: list[Path], prompt: list[int], tokens: int,
                mixed: bool, threads: int, rounds: int = 3) -> dict[str, float]:
    """Tokens/s of len(paths) requests, each with its own adapter, in ours and in one peft
    process holding them (`bench.peft_process`, in a process of its own at OpenMP's defaults,
    on `threads`; `mixed`: one batch with `adapter_names`, else one generate an adapter), the
    same tokens, rounds in turn: the best of `rounds` for each side."""
    for k, path in enumerate(paths):  # resident first: this measures decode, not loading
        ours.add(f"warm{k}", path, prompt, tokens=1)
    ours.drain()
    best = {"ours": 0.0, "plain": 0.0}
    plain = PeftProcess(resolve_model(MODEL), paths, prompt, tokens, threads, mixed)
    with plain:
        for r in range(rounds):
            best["ours"] = max(best["ours"], _ours_round(ours, paths, prompt, tokens, r))
            best["plain"] = max(best["plain"], len(paths) * tokens / plain.round())
    return best


def _ours_round(ours: Ours, paths: list[Path], prompt: list[int], tokens: int, r: int) -> float:
    """Tokens/s of one round of ours: a request an adapter, decoded together."""
    started = time.perf_counter()
    for k, path in enumerate(paths):
        ours.add(f"round{r}-{k}", path, prompt, tokens=tokens)
    left = len(paths)
    while left:
        left -= len(ours.step())
    return len(paths) * tokens / (time.perf_counter() - started)


def resident_bytes(ours: Ours, paths: list[Path]) -> float:
    """Memory each adapter adds once resident (loading `paths`, at most the capacity; each
    load's time goes to `ours.cold_ms`)."""
    import gc

    gc.collect()
    before = uss()
    for path in paths:
        started = time.perf_counter()
        ours.adapters.route(str(path), W.AdapterRef(str(path), "LORA"))
        ours.cold_ms.append(1e3 * (time.perf_counter() - started))
    gc.collect()
    return (uss() - before) / len(paths)

"""Many adapters (13): one tenant's worker holding its LoRA adapters (workers/inference/adapters.py,
the real class, against the run's executor) beside one plain peft process holding all of them,
on tiny-llama with LoRA r8 adapters: mixed-adapter batches, Zipf traffic over 10 and over 1,000
adapters with 32 resident, cold loads, memory per resident adapter; IA3 and prompt-tuning
adapters in other_methods.py. Both sides run in this process, one after the other, with the
same torch threads."""

from __future__ import annotations

import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import torch
from peft import PeftModel, get_peft_model
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from bench.models import adapter
from bench.records import Record
from bench.scenarios.common import Settings
from bench.scenarios.other_methods import method_records
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


def zipf(n: int, count: int, seed: int = 0, s: float = 1.1) -> list[int]:
    weights = torch.tensor([1 / (k + 1) ** s for k in range(n)])
    return torch.multinomial(weights, count, replacement=True,
                             generator=torch.Generator().manual_seed(seed)).tolist()


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
            return remote_model(MODEL, endpoint, client_name="bench-adapters")

        self.adapters = Adapters(base(), engine, base, budget=Budget(capacity))
        self.cold_ms: list[float] = []

    def add(self, request_id: str, path: Path, prompt: list[int], tokens: int = TOKENS) -> None:
        from workers.inference.engine import Request

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


def serve_ours(ours: Ours, paths: list[Path], order: list[int], prompt: list[int]) -> dict:
    started, latencies, queue = {}, [], list(enumerate(order))
    begin = time.perf_counter()
    while queue or started:
        while queue and len(started) < IN_FLIGHT:
            i, k = queue.pop(0)
            started[str(i)] = time.perf_counter()
            ours.add(str(i), paths[k], prompt)
        for request_id in ours.step():
            latencies.append(time.perf_counter() - started.pop(request_id))
    return {"elapsed": time.perf_counter() - begin, "latencies": latencies}


def serve_plain(model: PeftModel, order: list[int], prompt: list[int]) -> dict:
    """Batches of `IN_FLIGHT` requests, each row with its adapter (peft's mixed batches)."""
    latencies, begin = [], time.perf_counter()
    ids = torch.tensor([prompt] * IN_FLIGHT)
    for at in range(0, len(order), IN_FLIGHT):
        names = [f"a{k}" for k in order[at:at + IN_FLIGHT]]
        started = time.perf_counter()
        with torch.no_grad():
            model.generate(input_ids=ids[:len(names)], attention_mask=torch.ones_like(
                ids[:len(names)]), adapter_names=names, max_new_tokens=TOKENS,
                min_new_tokens=TOKENS, do_sample=False)
        latencies += [time.perf_counter() - started] * len(names)
    return {"elapsed": time.perf_counter() - begin, "latencies": latencies}


def plain_holding(paths: list[Path]) -> PeftModel:
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(resolve_model(MODEL)),
                                      paths[0], adapter_name="a0")
    for k, path in enumerate(paths[1:], start=1):
        model.load_adapter(path, adapter_name=f"a{k}", low_cpu_mem_usage=True)
    return model.eval()


def p95(latencies: list[float]) -> float:
    return statistics.quantiles(latencies, n=20)[-1] * 1e3


def uss() -> int:
    return psutil.Process().memory_full_info().uss


def many_adapters(settings: Settings) -> list[Record]:
    torch.set_num_threads(settings.threads)
    many = 50 if settings.toy else 1000
    requests = 16 if settings.toy else 160 if settings.quick else 400
    executor = settings.executors.get(MODEL, policy="opportunistic", threads=settings.threads,
                                      dtype=settings.dtype, device=settings.device)
    tokenizer = AutoTokenizer.from_pretrained(resolve_model(MODEL))
    prompt = tokenizer.encode("A tenant asks one of its many adapters for a few words")
    root = Path(tempfile.mkdtemp(prefix="symb-adapters-"))
    try:
        paths = make_adapters(root, many)
        ours = Ours(executor.endpoint, tokenizer)
        mixed = mixed_batch(ours, paths[:8], prompt)
        file_mib = (paths[1] / "adapter_model.safetensors").stat().st_size / 2**20
        per_adapter = resident_bytes(ours, paths[8:RESIDENT]) / 2**20  # none let go
        ours.cold_ms.clear()
        few = serve_ours(ours, paths, [k for k in zipf(10, requests, seed=1)], prompt)
        middle = min(100, many)
        hundred = serve_ours(ours, paths, zipf(middle, requests, seed=3), prompt)
        spread = serve_ours(ours, paths, zipf(many, requests, seed=2), prompt)
        for k, path in enumerate(paths[-8:]):  # and a few the traffic never asked for
            if str(path) not in ours.adapters.loaded:
                ours.add(f"cold{k}", path, prompt, tokens=1)
        ours.drain()
        cold = statistics.median(ours.cold_ms)
        before = uss()
        plain = plain_holding(paths)
        plain_per_adapter = (uss() - before) / many / 2**20
        plain_spread = serve_plain(plain, zipf(many, requests, seed=2), prompt)
        others = [record for method in ("ia3", "prompt_tuning") for record in method_records(
            method, Ours(executor.endpoint, tokenizer),
            make_adapters(root / method, 8 + RESIDENT // 2, method), prompt)]
    finally:
        shutil.rmtree(root, ignore_errors=True)
    name = "13 many adapters"
    return [
        Record(name, "mixed-adapter decode, 8 adapters in one batch: tokens/s vs one peft "
               "process with adapter_names", mixed["ours"], mixed["plain"], "tok/s", ">= 1.0x"),
        Record(name, f"Zipf over {many} adapters, {RESIDENT} resident: p95 latency vs over 10",
               p95(spread["latencies"]), p95(few["latencies"]), "ms", "<= 2.0x",
               higher_is_better=False),
        Record(name, f"Zipf over {middle} adapters, {RESIDENT} resident: p95 latency vs over 10",
               p95(hundred["latencies"]), p95(few["latencies"]), "ms", higher_is_better=False),
        Record(name, f"Zipf over {many} adapters: requests/s vs one peft process holding all",
               requests / spread["elapsed"], requests / plain_spread["elapsed"], "req/s"),
        Record(name, "a cold adapter's load (LoRA r8), median", cold, None, "ms", "<= 100 ms"),
        Record(name, "memory per resident adapter vs its file size (+0.05 MiB: the goal's 0.1 "
               "MiB bookkeeping at 2x)", per_adapter, file_mib + 0.05, "MiB", "<= 2.0x",
               higher_is_better=False),
        Record(name, "memory per adapter: one peft process holding all", plain_per_adapter,
               None, "MiB"),
        *others,
    ]


def mixed_batch(ours: Ours, paths: list[Path], prompt: list[int],
                tokens: int = 16) -> dict[str, float]:
    """Tokens/s of one batch of len(paths) requests, each with its own adapter, against one
    peft process's mixed batch (`adapter_names`)."""
    plain = plain_holding(paths)
    ids = torch.tensor([prompt] * len(paths))
    names = [f"a{k}" for k in range(len(paths))]

    def plain_round() -> None:
        plain.generate(input_ids=ids, attention_mask=torch.ones_like(ids), adapter_names=names,
                       max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False)
    return best_speeds(ours, paths, prompt, plain_round, tokens)


def best_speeds(ours: Ours, paths: list[Path], prompt: list[int],
                plain_round: Callable[[], None], tokens: int, rounds: int = 3) -> dict[str, float]:
    """Tokens/s of len(paths) requests, each with its own adapter, in ours and in
    `plain_round` (the same tokens): the best of `rounds` for each side."""
    for k, path in enumerate(paths):  # resident first: this measures decode, not loading
        ours.add(f"warm{k}", path, prompt, tokens=1)
    ours.drain()
    best = {"ours": 0.0, "plain": 0.0}
    for r in range(rounds):
        started = time.perf_counter()
        for k, path in enumerate(paths):
            ours.add(f"round{r}-{k}", path, prompt, tokens=tokens)
        left = len(paths)
        while left:
            left -= len(ours.step())
        best["ours"] = max(best["ours"], len(paths) * tokens / (time.perf_counter() - started))
        started = time.perf_counter()
        with torch.no_grad():
            plain_round()
        best["plain"] = max(best["plain"], len(paths) * tokens / (time.perf_counter() - started))
    return best


def resident_bytes(ours: Ours, paths: list[Path]) -> float:
    """Memory each adapter adds once resident (loading `paths`, at most the capacity)."""
    import gc

    gc.collect()
    before = uss()
    for path in paths:
        ours.adapters.route(str(path), W.AdapterRef(str(path), "LORA"))
    gc.collect()
    return (uss() - before) / len(paths)

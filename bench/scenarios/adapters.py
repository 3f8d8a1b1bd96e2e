"""Many adapters (13): one tenant's worker holding its LoRA adapters (workers/inference/adapters.py,
the real class, against the run's executor) beside one plain peft process holding all of them,
on tiny-llama with LoRA r8 adapters: mixed-adapter batches, Zipf traffic over 10 and over 1,000
adapters with 32 resident, cold loads, memory per resident adapter; IA3 and prompt-tuning
adapters in other_methods.py. Ours' worker part runs in this process on a worker's threads (the
worker manager's share for one worker, `worker_threads`; each forward on as many as its tokens
keep busy), the executor and each peft side on the run's threads (the speed rows' peft in a
process of its own, the Zipf rows' in this one)."""

from __future__ import annotations

import shutil
import statistics
import tempfile
import time
from pathlib import Path

import torch
from peft import PeftModel
from transformers import AutoTokenizer

from bench.models import FIXED_LENGTH
from bench.quantiles import quantile_ms
from bench.records import Record
from bench.scenarios.adapter_sides import (
    IN_FLIGHT,
    MODEL,
    RESIDENT,
    TOKENS,
    Ours,
    best_speeds,
    make_adapters,
    plain_holding,
    resident_bytes,
    uss,
)
from bench.scenarios.common import Settings, worker_threads
from bench.scenarios.other_methods import method_records
from catalogue.resolve import resolve_model


def zipf(n: int, count: int, seed: int = 0, s: float = 1.1) -> list[int]:
    weights = torch.tensor([1 / (k + 1) ** s for k in range(n)])
    return torch.multinomial(weights, count, replacement=True,
                             generator=torch.Generator().manual_seed(seed)).tolist()


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
                **FIXED_LENGTH, do_sample=False)
        latencies += [time.perf_counter() - started] * len(names)
    return {"elapsed": time.perf_counter() - begin, "latencies": latencies}


def p95(latencies: list[float]) -> float:
    return quantile_ms(sorted(latencies), 0.95)


def many_adapters(settings: Settings) -> list[Record]:
    torch.set_num_threads(worker_threads(settings))  # ours' worker part; plain's get the run's
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
        mixed = mixed_batch(ours, paths[:8], prompt, settings.threads)
        file_mib = (paths[1] / "adapter_model.safetensors").stat().st_size / 2**20
        per_adapter = resident_bytes(ours, paths[8:RESIDENT]) / 2**20  # none let go
        with_room = statistics.median(ours.cold_ms)  # each a copy of a resident one's modules
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
        torch.set_num_threads(settings.threads)
        plain_spread = serve_plain(plain, zipf(many, requests, seed=2), prompt)
        torch.set_num_threads(worker_threads(settings))
        others = [record for method in ("ia3", "prompt_tuning") for record in method_records(
            method, Ours(executor.endpoint, tokenizer),
            make_adapters(root / method, 8 + RESIDENT // 2, method), prompt, settings.threads)]
    finally:
        shutil.rmtree(root, ignore_errors=True)
        torch.set_num_threads(settings.threads)  # the run's, for the scenarios after this one
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
        Record(name, "a cold adapter's load at a full worker (LoRA r8), median", cold, None,
               "ms", "<= 100 ms"),
        Record(name, f"a cold adapter's load with room (LoRA r8, up to {RESIDENT} resident), "
               "median", with_room, None, "ms", "<= 100 ms"),
        Record(name, "memory per resident adapter vs its file size (+0.05 MiB: the goal's 0.1 "
               "MiB bookkeeping at 2x)", per_adapter, file_mib + 0.05, "MiB", "<= 2.0x",
               higher_is_better=False),
        Record(name, "memory per adapter: one peft process holding all", plain_per_adapter,
               None, "MiB"),
        *others,
    ]


def mixed_batch(ours: Ours, paths: list[Path], prompt: list[int], threads: int,
                tokens: int = 16) -> dict[str, float]:
    """Tokens/s of one batch of len(paths) requests, each with its own adapter, against one
    peft process's mixed batch (`adapter_names`, on `threads`)."""
    return best_speeds(ours, paths, prompt, tokens, mixed=True, threads=threads)

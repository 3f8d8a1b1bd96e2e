# ruff: noqa: F811  (the fixture imported from test_engine is an argument here)
"""The engine's KV budget: a request's rows join the batch on the device while what its cache
can come to fits the budget, else the offloaded one (in host memory), with the same tokens."""

from __future__ import annotations

import pytest
import torch

from executor.local import LocalExecutor
from tests.peft_reference import build_pair
from tests.workers.inference.test_engine import (  # noqa: F401 (tokenizer: a fixture)
    MODEL,
    generated,
    prompts,
    text,
    tokenizer,
)
from wire import manager as W
from workers.inference.batch import BatchCache
from workers.inference.engine import InferenceEngine
from workers.inference.request import Request
from workers.inference.rooms import ROOM


@pytest.mark.parametrize("model", ["tiny-llama", "tiny-gpt2", "tiny-gemma2"])
def test_kv_bytes_per_token_is_what_a_prefill_caches(model: str) -> None:
    from transformers import DynamicCache

    from workers.inference.batch import kv_bytes_per_token
    from workers.inference.rooms import cache_tensors

    _, ours = build_pair(model, "lora", LocalExecutor.load(model))
    ids = torch.arange(7).unsqueeze(0)
    with torch.no_grad():
        out = ours(input_ids=ids, past_key_values=DynamicCache(), use_cache=True)
    cached = sum(k.nbytes + v.nbytes for k, v in cache_tensors(out.past_key_values))
    assert kv_bytes_per_token(ours.config, ours.dtype) * 7 == cached


def test_requests_beyond_the_kv_budget_run_offloaded_with_the_same_tokens(tokenizer) -> None:
    plain, ours = build_pair(MODEL, "lora", LocalExecutor.load(MODEL))
    offload_and_compare(plain, ours, tokenizer)


def test_the_rooms_on_the_device_never_pass_the_kv_budget(tokenizer) -> None:
    """A batch's rows are left-padded to its longest and held in rooms with room to grow: a
    budget of 150 positions holds a 40-token prompt's row (40 + 10 positions in a room of 104),
    not a 3-token one's beside it (2 rows of 41 and more: 210), though their tokens (50 + 13)
    would fit: the short one runs offloaded, and the rooms held never pass the budget."""
    _, ours = build_pair(MODEL, "lora", LocalExecutor.load(MODEL))
    probe = InferenceEngine(ours.eval(), tokenizer, max_context=2048, eos_ids=())
    budget = 150 * probe.kv_token_bytes
    engine = InferenceEngine(ours, tokenizer, max_context=2048, eos_ids=(),
                             kv_budget_bytes=budget)
    greedy = W.SamplingParams(max_tokens=10, temperature=0)
    engine.add(Request("long", list(range(100, 140)), greedy))
    engine.step()
    engine.add(Request("short", [5, 6, 7], greedy))
    held, rows = 0, {"resident": 0, "offloaded": 0}
    while engine.has_work():
        engine.step()
        held = max(held, sum(layer.room[0].nbytes + layer.room[1].nbytes
                             for layer in engine.resident.cache.layers))
        rows["resident"] = max(rows["resident"], engine.resident.rows)
        rows["offloaded"] = max(rows["offloaded"], engine.offloaded.rows)
    assert rows == {"resident": 1, "offloaded": 1}
    assert held == (40 + ROOM) * probe.kv_token_bytes <= budget


@pytest.mark.gpu
def test_on_a_gpu_offloaded_caches_rest_in_host_memory_with_the_same_tokens(tokenizer,
                                                                            executor_for):
    from workers.remote.client import ExecutorClient

    client = ExecutorClient(executor_for(MODEL, device="cuda").endpoint, name="offload",
                            device="cuda")
    try:
        plain, ours = build_pair(MODEL, "lora", client, device="cuda")
        offload_and_compare(plain.to("cuda"), ours, tokenizer)
    finally:
        client.close()


class HostStream:
    """Stands in for a CUDA stream on the host, where work is done once it is queued."""

    def wait_stream(self, stream: object) -> None:
        pass

    def __enter__(self) -> HostStream:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


def test_the_offloading_cache_a_gpu_takes_runs_on_the_host_with_the_same_tokens(tokenizer,
                                                                             monkeypatch):
    """The offloaded batch's path on a GPU (transformers' offloading cache, fetching each layer
    before its attention; rows rewritten into it as they join and leave) driven on the host,
    the streams it orders its copies by stood in (the host has none)."""
    monkeypatch.setattr(torch, "Stream", HostStream)
    monkeypatch.setattr(torch.cuda, "default_stream", lambda device=None: HostStream())
    plain, ours = build_pair(MODEL, "lora", LocalExecutor.load(MODEL))
    offload_and_compare(plain, ours, tokenizer, streams=True)


def offload_and_compare(plain, ours, tokenizer, streams: bool | None = None) -> None:
    """A budget of one request's cache: the first request stays on the device, the three
    that come while it runs are offloaded; every output equals plain generate(). `streams`:
    the offloaded batch's choice of transformers' offloading cache (by default its device's)."""
    plain.eval()
    probe = InferenceEngine(ours.eval(), tokenizer, max_context=2048, eos_ids=())
    # the first's 5 + 10 positions in a room of 64 more; two rows would take 2 x (19 + 64)
    engine = InferenceEngine(ours, tokenizer, max_context=2048, eos_ids=(), max_batch=8,
                             kv_budget_bytes=(15 + ROOM) * probe.kv_token_bytes)
    engine.offloaded = BatchCache(engine.device, offloaded=True, streams=streams)
    greedy = W.SamplingParams(max_tokens=10, temperature=0)
    requests = [Request(str(i), p, greedy) for i, p in enumerate(prompts())]
    rows = {"resident": 0, "offloaded": 0}
    events: dict[str, list] = {r.id: [] for r in requests}
    step = added = offloading = 0
    while added < len(requests) or engine.has_work():
        while added < len(requests) and step >= added * 2:
            events[requests[added].id] += engine.add(requests[added])
            added += 1
        for event in engine.step():
            events[event.id].append(event)
        rows["resident"] = max(rows["resident"], engine.resident.rows)
        rows["offloaded"] = max(rows["offloaded"], engine.offloaded.rows)
        if engine.offloaded.streams and engine.offloaded.rows:  # resting in host memory
            assert engine.offloaded.cache.layers[-1].keys.device.type == "cpu"
            offloading += engine.offloaded.cache.offloading
        step += 1
    assert bool(offloading) == engine.offloaded.streams  # the cache the device calls for
    assert rows == {"resident": 1, "offloaded": 3}  # 5+10 tokens fit; then 9+10, 3+10, 12+10
    for request in requests:
        assert text(events[request.id]) == generated(plain, tokenizer, request.prompt_ids, 10)
    assert engine.resident.rows == engine.offloaded.rows == 0

# ruff: noqa: F811  (the fixtures imported from test_adapters are arguments here)
"""Chunked prefill in a worker of many adapters (in-process executor; the packed case through an
executor process too, on a GPU where there is one): long prompts of two LoRA adapters come in
by chunks side by side in one shared engine, each through its own adapter, a chunk rides in the
decode forward of rows of other adapters, and every request still equals plain peft."""

from __future__ import annotations

import pytest

from tests.workers.inference.test_adapters import (  # noqa: F401  (fixtures)
    GREEDY,
    adapters,
    plain_tokens,
    saved,
    tokenizer,
)
from wire import manager as W
from workers.inference.chunks import MIN_TOKENS
from workers.inference.request import Request


def test_long_prompts_come_in_by_chunks_each_through_its_own_adapter(saved, tokenizer) -> None:
    """Beside a running request, prompts of ~30 tokens for LoRA, IA3, prefix and prompt tuning
    in 8-token chunks (prefix and prompt tuning's whole, through their own models): each
    request's tokens are plain peft's with its adapter alone."""
    held = adapters(tokenizer, chunk_tokens=8)
    engine, _ = held.route("base", None)
    engine.add(Request("running", tokenizer.encode("request running says"),
                       W.SamplingParams(max_tokens=40, temperature=0)))
    engine.step()
    asks = {"a": "t/lora-a@1", "b": "t/lora-b@1", "ia3": "t/ia3@1", "prefix": "t/prefix@1",
            "prompt": "t/prompt@1"}
    prompts = {rid: tokenizer.encode(f"request {rid} says " * 6) for rid in asks}
    for rid, model in asks.items():
        routed, adapter = held.route(model, W.AdapterRef(str(saved[model]), ""))
        assert routed.add(Request(rid, prompts[rid], GREEDY, adapter=adapter,
                                  prefill=held.prefill_of(model))) == []
    texts: dict[str, str] = {rid: "" for rid in asks}
    chunked = 0
    while any(e.has_work() for e in held.engines()):
        for each in held.engines():
            chunked = max(chunked, len(each.chunks.partials))
            for event in each.step() if each.has_work() else []:
                assert not isinstance(event, W.Failed), event
                if isinstance(event, W.Delta) and event.id in texts:
                    texts[event.id] += event.text
    assert chunked >= 2  # the LoRA prompts (one engine) came in by chunks side by side
    for rid, model in asks.items():
        expected = tokenizer.encode(tokenizer.decode(plain_tokens(saved[model], prompts[rid])))
        assert tokenizer.encode(texts[rid]) == expected, rid


@pytest.mark.parametrize("device", ["in-process", "cpu", pytest.param("cuda",
                                                                     marks=pytest.mark.gpu)])
@pytest.mark.parametrize("asks", [
    {"base": None, "a": "t/lora-a@1", "b": "t/lora-b@1"},
    {"base": "t/ia3@3", "a": "t/ia3@1", "b": "t/ia3@2"}], ids=["lora", "ia3"])
def test_a_chunk_packs_beside_rows_of_other_adapters(saved, tokenizer, asks, device,
                                                     client_on) -> None:
    """In one engine of many adapters (LoRA's shared one, with the base model; IA3's group),
    rows of two decode while a third's prompt comes in 16 tokens a step (the least a step): one
    forward a step, each position through its own row's adapter (test_packed.py); each
    request's tokens are plain peft's with its adapter alone. In-process, and through an
    executor process on `device` with the worker's models there: on a GPU each position's
    adapter (`lora_rows.along`, IA3's scales along the sequence) is picked on the device."""
    if device == "in-process":
        held, device = adapters(tokenizer, chunk_tokens=8), "cpu"
    else:
        held = adapters(tokenizer, chunk_tokens=8, device=device,
                        executor=client_on(device, f"adapter-chunks-{device}"))
    check_packs_beside_other_adapters(saved, tokenizer, asks, held, device)


def check_packs_beside_other_adapters(saved, tokenizer, asks, held, device: str) -> None:
    """Rows of `asks`' "base" and "a" decoding in `held`'s engine while "b"'s prompt comes in
    by chunks: packed forwards of 2 rows and MIN_TOKENS, texts plain peft's on `device`."""
    prompts = {"base": tokenizer.encode("request base says"),
               "a": tokenizer.encode("request a says"),
               "b": tokenizer.encode("request b says " * 10)}
    shapes: list[tuple[int, ...]] = []
    texts = {rid: "" for rid in asks}
    engines = set()

    def add(rid: str) -> None:
        model = asks[rid]
        ref = None if model is None else W.AdapterRef(str(saved[model]), "")
        engine, adapter = held.route(model or "base", ref)
        engines.add(engine)
        assert engine.add(Request(rid, prompts[rid], GREEDY, adapter=adapter)) == []

    def step() -> None:
        for event in engine.step():
            assert not isinstance(event, W.Failed), event
            if isinstance(event, W.Delta):
                texts[event.id] += event.text

    add("base")
    add("a")
    (engine,) = engines  # the rows' engine
    step()
    engine.decode_model.register_forward_pre_hook(
        lambda _, args, kw: shapes.append(tuple(kw["input_ids"].shape)), with_kwargs=True)
    add("b")
    assert engines == {engine}
    while engine.has_work():
        step()
    packed = [shape for shape in shapes if shape[0] == 1 and shape[1] > 2]
    assert len(packed) == -(-len(prompts["b"]) // MIN_TOKENS) > 1
    assert packed[0] == (1, 2 + MIN_TOKENS)
    for rid, model in asks.items():
        path = None if model is None else saved[model]
        expected = tokenizer.encode(tokenizer.decode(plain_tokens(path, prompts[rid],
                                                                  device)))
        assert tokenizer.encode(texts[rid]) == expected, rid

"""Embeddings in a worker's engines (in-process executor, and an executor process): each
prompt's embedding, whatever its adapter (LoRA rows beside the base model's in one forward,
IA3's group, prompt tuning's virtual tokens, AdaLoRA's own model), its model's positions (GPT-2's
learned ones) and the prompts sharing its forward, equals plain transformers + peft's last
hidden state at its last token, normalized; decode steps go on between a large request's
forwards, its adapter stays loaded while it waits, and a failure is its forward's requests'
alone (a lost executor: every request of the step answered by `fail_all`)."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM, AutoTokenizer

from catalogue.resolve import resolve_model
from executor.local import LocalExecutor
from tests.peft_reference import embedding_of, save_adapters
from tests.workers.inference.test_adapters import adapters
from wire import manager as W
from workers.inference import embedding
from workers.inference.engine import InferenceEngine
from workers.inference.request import Request
from workers.remote.build import remote_model
from workers.remote.handle import ExecutorUnavailable

MODEL = "tiny-llama"
HIDDEN = 64  # tiny-llama's hidden size
METHODS = {"t/lora@1": ("lora", 1), "t/lora@2": ("lora", 2), "t/ia3@1": ("ia3", 3),
           "t/prompt@1": ("prompt_tuning", 4), "t/adalora@1": ("adalora", 5)}
PROMPTS = [[1, 15, 27, 3, 99], [1, 44], [1, 8, 8, 8, 120, 7], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]]


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(resolve_model(MODEL))


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> dict[str, Path]:
    return save_adapters(tmp_path_factory, MODEL, METHODS)


def reference(path: Path | None, prompt: list[int], dimensions: int = 0) -> torch.Tensor:
    """Plain transformers + peft: the last layer's hidden state (after the final norm) at the
    prompt's last token, its first `dimensions`, of length 1."""
    model = AutoModelForCausalLM.from_pretrained(resolve_model(MODEL))
    if path is not None:
        model = PeftModel.from_pretrained(model, path)
    return embedding_of(model, prompt, dimensions)


def vector(event: W.Done) -> torch.Tensor:
    return torch.tensor(struct.unpack(f"<{len(event.embedding) // 4}f", event.embedding))


def embed(held, asks: list[tuple[str, str | None, list[int], int]],
          saved: dict[str, Path]) -> dict[str, W.Done]:
    """Every (request id, model, prompt, dimensions) added at once, every engine stepped until
    done: each request's Done."""
    for request_id, model, prompt, dimensions in asks:
        ref = None if model is None else W.AdapterRef(str(saved[model]), "")
        engine, adapter = held.route(model or "base", ref)
        params = W.SamplingParams(max_tokens=0, embed=True, dimensions=dimensions)
        assert engine.add(Request(request_id, prompt, params, adapter=adapter,
                                  prefill=held.prefill_of(model or "base"))) == []
    done: dict[str, W.Done] = {}
    while any(e.has_work() for e in held.engines()):
        for engine in held.engines():
            for event in engine.step() if engine.has_work() else []:
                assert not isinstance(event, W.Failed), event
                if isinstance(event, W.Done):
                    done[event.id] = event
    return done


def test_each_prompt_embeds_as_plain_peft_whatever_its_adapter_and_neighbours(
        saved, tokenizer) -> None:
    held = adapters(tokenizer)
    asks = [(f"{model}-{i}", model, prompt, 0) for model in [None, *METHODS]
            for i, prompt in enumerate(PROMPTS)]
    asks += [("short", "t/lora@1", PROMPTS[0], 16), ("one", None, [1], 0)]
    done = embed(held, asks, saved)
    assert sorted(done) == sorted(a[0] for a in asks)
    for request_id, model, prompt, dimensions in asks:
        got, path = vector(done[request_id]), None if model is None else saved[model]
        assert done[request_id].prompt_tokens == len(prompt)
        assert done[request_id].completion_tokens == 0
        assert got.shape == (dimensions or HIDDEN,)
        assert torch.allclose(got, reference(path, prompt, dimensions), atol=2e-5), request_id
    assert not torch.allclose(vector(done["t/lora@1-0"]), vector(done["t/lora@2-0"]), atol=1e-2)


def test_a_large_request_takes_a_step_s_tokens_at_a_time_beside_decoding(
        saved, tokenizer, monkeypatch) -> None:
    monkeypatch.setattr(embedding, "STEP_TOKENS", 12)
    held = adapters(tokenizer, capacity=1)
    engine, name = held.route("t/lora@1", W.AdapterRef(str(saved["t/lora@1"]), ""))
    greedy = W.SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
    engine.add(Request("talk", [1, 5, 6], greedy))
    engine.step()  # its prefill: it decodes from now on
    for i in range(6):
        engine.add(Request(f"e{i}", [1, 7, 9, 11, 13], W.SamplingParams(
            max_tokens=0, embed=True), adapter=name))
    held.unload("t/lora@1")
    answered = []
    while engine.has_work():
        events = engine.step()
        answered.append(sorted(e.id for e in events if isinstance(e, W.Done) and e.embedding))
        assert any(isinstance(e, W.Delta) and e.id == "talk" for e in events) or \
            not any(s.request.id == "talk" for s in engine.running)
        assert "t/lora@1" in held.loaded or not engine.has_work()
        held.settle()
    assert answered[:3] == [["e0", "e1"], ["e2", "e3"], ["e4", "e5"]]  # 10 of 12 tokens a step
    assert "t/lora@1" not in held.loaded  # let go once its last embedding was answered
    want = reference(saved["t/lora@1"], [1, 7, 9, 11, 13])
    done = embed(adapters(tokenizer), [("again", "t/lora@1", [1, 7, 9, 11, 13], 0)], saved)
    assert torch.allclose(vector(done["again"]), want, atol=2e-5)


def test_a_failed_forward_fails_its_requests_only(saved, tokenizer, monkeypatch) -> None:
    held = adapters(tokenizer)
    calls = []

    def failing(model, rows, requests, device):
        calls.append([r.id for r in requests])
        if len(calls) == 1:
            raise RuntimeError("boom")
        return real(model, rows, requests, device)

    real = embedding.last_states
    monkeypatch.setattr(embedding, "last_states", failing)
    engine, _ = held.route("base", None)
    for request_id, prompt in (("long-a", PROMPTS[3]), ("long-b", PROMPTS[3]), ("x", [1])):
        engine.add(Request(request_id, prompt, W.SamplingParams(max_tokens=0, embed=True)))
    events = engine.step()
    failed = sorted(e.id for e in events if isinstance(e, W.Failed))
    assert failed == sorted(calls[0]) and "x" not in failed
    assert [e.code for e in events if isinstance(e, W.Failed)] == ["internal_error"] * 2
    assert torch.allclose(vector(next(e for e in events if isinstance(e, W.Done))),
                          reference(None, [1]), atol=2e-5)


def test_an_embedding_that_is_not_finite_fails_its_request_alone(tokenizer, monkeypatch) -> None:
    """A row of NaN or infinity (an adapter's broken weights) is refused with a clear error, not
    sent on as numbers JSON cannot carry; the forward's other rows are answered."""
    real = embedding.last_states

    def spoiled(model, rows, requests, device):
        states = real(model, rows, requests, device)
        for row, request in enumerate(requests):
            if request.id != "fine":
                states[row, 3] = float("nan") if request.id == "nan" else float("inf")
        return states

    monkeypatch.setattr(embedding, "last_states", spoiled)
    engine, _ = adapters(tokenizer).route("base", None)
    for request_id in ("nan", "fine", "inf"):
        engine.add(Request(request_id, [1, 2], W.SamplingParams(max_tokens=0, embed=True)))
    events = engine.step()
    failed = {e.id: (e.status, e.code) for e in events if isinstance(e, W.Failed)}
    assert failed == {"nan": (500, "invalid_embedding"), "inf": (500, "invalid_embedding")}
    (done,) = [e for e in events if isinstance(e, W.Done)]
    assert done.id == "fine" and torch.allclose(vector(done), reference(None, [1, 2]), atol=2e-5)


def test_a_lost_executor_fails_every_request_of_the_step(tokenizer, monkeypatch) -> None:
    """Where the executor goes mid-step, the step's answers so far go with it: every request it
    took waits again, so that the worker's `fail_all` answers each (none is left unanswered)."""
    real, calls = embedding.last_states, []

    def losing(model, rows, requests, device):
        calls.append(len(requests))
        if len(calls) == 2:
            raise ExecutorUnavailable("gone")
        return real(model, rows, requests, device)

    monkeypatch.setattr(embedding, "last_states", losing)
    engine, _ = adapters(tokenizer).route("base", None)
    for request_id, prompt, dimensions in (("a", PROMPTS[3], 0), ("b", [1], 0),
                                           ("wide", [1], HIDDEN + 1)):
        engine.add(Request(request_id, prompt, W.SamplingParams(
            max_tokens=0, embed=True, dimensions=dimensions)))
    engine.add(Request("talk", [1, 5], W.SamplingParams(max_tokens=2)))
    with pytest.raises(ExecutorUnavailable):
        engine.step()
    assert calls == [1, 1]  # the first answered, then lost with the second
    failed = engine.fail_all(503, "executor_unavailable", "gone")
    assert sorted(e.id for e in failed) == ["a", "b", "talk", "wide"]
    assert not engine.has_work()


def test_more_dimensions_than_the_model_has_are_refused_alone(tokenizer) -> None:
    engine, _ = adapters(tokenizer).route("base", None)
    for request_id, dimensions in (("wide", HIDDEN + 1), ("whole", HIDDEN)):
        engine.add(Request(request_id, [1, 2], W.SamplingParams(
            max_tokens=0, embed=True, dimensions=dimensions)))
    events = engine.step()
    (failed,) = [e for e in events if isinstance(e, W.Failed)]
    assert (failed.id, failed.status, failed.code) == ("wide", 400, "invalid_dimensions")
    (done,) = [e for e in events if isinstance(e, W.Done)]
    assert done.id == "whole" and torch.allclose(vector(done), reference(None, [1, 2]), atol=2e-5)
    assert not engine.has_work()


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_embeddings_through_an_executor_process(saved, tokenizer, device, client_on) -> None:
    """A worker of an executor process (on a GPU, its tensors and the hidden states there):
    the same vectors as plain peft's on the CPU."""
    held = adapters(tokenizer, device=device, executor=client_on(device, f"embed-{device}"))
    asks = [("lora", "t/lora@1", PROMPTS[0], 0), ("base", None, PROMPTS[2], 8),
            ("lora-long", "t/lora@1", PROMPTS[3], 0), ("ia3", "t/ia3@1", PROMPTS[1], 0)]
    done = embed(held, asks, saved)
    for request_id, model, prompt, dimensions in asks:
        path = None if model is None else saved[model]
        assert torch.allclose(vector(done[request_id]), reference(path, prompt, dimensions),
                              atol=1e-4), request_id


@pytest.mark.parametrize("name", ["tiny-gpt2", "tiny-starcoder"])
def test_prompts_of_learned_positions_share_a_forward_exactly(name: str) -> None:
    """GPT-2's positions are learned, not rotary: a left-padded row's positions must count from
    its first token (RoPE's relative angles hide a shift, these do not)."""
    tokenizer = AutoTokenizer.from_pretrained(resolve_model(name))
    engine = InferenceEngine(remote_model(name, LocalExecutor.load(name)), tokenizer,
                             max_context=512, eos_ids=())
    for i, prompt in enumerate(PROMPTS):
        engine.add(Request(f"r{i}", prompt, W.SamplingParams(max_tokens=0, embed=True)))
    done = {e.id: e for e in engine.step() if isinstance(e, W.Done)}
    plain = AutoModelForCausalLM.from_pretrained(resolve_model(name))
    for i, prompt in enumerate(PROMPTS):
        assert torch.allclose(vector(done[f"r{i}"]), embedding_of(plain, prompt), atol=2e-5)

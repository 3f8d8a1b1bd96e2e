"""remote_model with the in-process executor stand-in: structure, stubs and clear failures."""

from __future__ import annotations

import pytest
import torch
from peft import IA3Config, LoraConfig, TaskType, get_peft_model
from transformers import AutoModelForCausalLM, DynamicCache, StaticCache

from catalogue.base_layers import base_layer_names
from catalogue.resolve import resolve_model
from executor.local import LocalExecutor
from tests.conftest import TINY_MODELS
from tests.peft_reference import low_precision_errors
from workers.remote.build import ModelMismatch, remote_model
from workers.remote.layers import BaseWeightUnavailable, RemoteEmbedding, RemoteLayer, RemoteLinear


@pytest.fixture(scope="module")
def llama_executor() -> LocalExecutor:
    return LocalExecutor.load("tiny-llama")


def storage_bytes(model: torch.nn.Module) -> int:
    seen, total = set(), 0
    for t in [*model.parameters(), *model.buffers()]:
        storage = t.untyped_storage()
        if storage.data_ptr() not in seen:
            seen.add(storage.data_ptr())
            total += storage.nbytes()
    return total


@pytest.mark.parametrize("name", TINY_MODELS)
def test_holds_no_base_weights_and_matches_buffers(name: str) -> None:
    plain = AutoModelForCausalLM.from_pretrained(resolve_model(name))
    ours = remote_model(name, LocalExecutor.load(name))
    remote = [m for m in ours.modules() if isinstance(m, RemoteLayer)]
    assert len(remote) >= 8
    base = tuple(f"{name}." for name in base_layer_names(plain))
    local_bytes = sum(t.numel() * t.element_size()
                      for n, t in [*plain.named_parameters(), *plain.named_buffers()]
                      if not n.startswith(base))
    assert storage_bytes(ours) <= local_bytes + 4 * len(remote) * 2
    plain_buffers = dict(plain.named_buffers())
    for key, buffer in ours.named_buffers():
        if key in plain_buffers:
            assert torch.equal(buffer, plain_buffers[key]), key
    ids = torch.tensor([[11, 400, 7, 9000]])
    torch.testing.assert_close(ours(ids).logits, plain(ids).logits, rtol=0, atol=1e-5)


def test_stub_weights_have_shape_but_no_data(llama_executor) -> None:
    model = remote_model("tiny-llama", llama_executor)
    q = model.model.layers[0].self_attn.q_proj
    assert isinstance(q, RemoteLinear) and isinstance(q, torch.nn.Linear)
    assert q.weight.shape == (64, 64) and q.weight.dtype == torch.float32
    assert q.weight.untyped_storage().nbytes() == 4
    with pytest.raises(BaseWeightUnavailable, match="shared executor"):
        _ = q.weight + 1
    model.to(torch.bfloat16)
    assert q.weight.dtype == torch.bfloat16 and q.weight.untyped_storage().nbytes() == 2
    assert isinstance(model.model.embed_tokens, RemoteEmbedding)


def test_dora_and_merging_fail_clearly(llama_executor) -> None:
    with pytest.raises(BaseWeightUnavailable, match="DoRA"):
        get_peft_model(remote_model("tiny-llama", llama_executor),
                       LoraConfig(r=2, target_modules=["q_proj"], use_dora=True))
    peft_model = get_peft_model(remote_model("tiny-llama", llama_executor),
                                LoraConfig(r=2, target_modules=["q_proj"]))
    with pytest.raises(BaseWeightUnavailable, match="merge"):
        peft_model.merge_and_unload()


def test_fused_calls_are_fewer_and_exact() -> None:
    fused_exec, plain_exec = LocalExecutor.load("tiny-llama"), LocalExecutor.load("tiny-llama")
    ids = torch.tensor([[5, 6, 7, 8]])
    fused = remote_model("tiny-llama", fused_exec, stretch=False)(ids).logits
    plain = remote_model("tiny-llama", plain_exec, fuse=False, stretch=False)(ids).logits
    torch.testing.assert_close(fused, plain, rtol=0, atol=1e-5)
    # per layer: q/k/v + gate/up fused -> 4 calls instead of 7; + embedding + lm_head
    assert (fused_exec.calls, plain_exec.calls) == (2 * 4 + 2, 2 * 7 + 2)


def test_fusion_falls_back_when_members_see_different_inputs() -> None:
    executor = LocalExecutor.load("tiny-llama")
    config = IA3Config(task_type=TaskType.CAUSAL_LM, target_modules=["up_proj", "k_proj"],
                       feedforward_modules=["up_proj"])  # IA3 rescales up_proj's input
    torch.manual_seed(0)
    plain = get_peft_model(AutoModelForCausalLM.from_pretrained(resolve_model("tiny-llama")),
                           config)
    ours = get_peft_model(remote_model("tiny-llama", executor), config)
    with torch.no_grad():
        for (_, a), (_, b) in zip(plain.named_parameters(), ours.named_parameters(), strict=False):
            if a.requires_grad:
                a.mul_(1.5)
                b.copy_(a)
    ids = torch.tensor([[5, 6, 7, 8]])
    for _ in range(4):
        torch.testing.assert_close(ours(ids).logits, plain(ids).logits, rtol=0, atol=1e-5)
    up = ours.base_model.model.model.layers[0].mlp.up_proj.base_layer
    assert up.fusion is not None and not up.fusion.enabled


def test_wrong_model_for_the_executor_is_refused(llama_executor) -> None:
    with pytest.raises(ModelMismatch, match="transformer"):
        remote_model("tiny-gpt2", llama_executor)


def test_generate_with_explicit_caches(llama_executor) -> None:
    plain = AutoModelForCausalLM.from_pretrained(resolve_model("tiny-llama"))
    ours = remote_model("tiny-llama", llama_executor)
    ids = torch.tensor([[5, 6, 7, 8]])
    expected = plain.generate(ids, max_new_tokens=6, do_sample=False)
    for cache in (DynamicCache(config=ours.config),
                  StaticCache(config=ours.config, max_cache_len=32)):
        out = ours.generate(ids, max_new_tokens=6, do_sample=False, past_key_values=cache)
        assert torch.equal(out, expected)


def test_large_calls_are_split_into_row_chunks_with_identical_results(monkeypatch) -> None:
    import workers.remote.layers as remote_layers

    config = LoraConfig(r=2, target_modules=["q_proj"], init_lora_weights=False)
    ids = torch.arange(3, 3 + 2 * 24).reshape(2, 24)
    plain = AutoModelForCausalLM.from_pretrained(resolve_model("tiny-llama"))
    vocab = plain.config.vocab_size
    whole_exec, chunked_exec = LocalExecutor.load("tiny-llama"), LocalExecutor.load("tiny-llama")
    results = []
    for model in (plain, whole_exec, chunked_exec):
        if model is chunked_exec:  # 16 rows of the widest (lm_head) output per call
            monkeypatch.setattr(remote_layers, "MAX_CALL_BYTES", 16 * 4 * vocab)
        if isinstance(model, LocalExecutor):
            model = remote_model("tiny-llama", model)
        torch.manual_seed(0)
        peft_model = get_peft_model(model, config)
        out = peft_model(ids, labels=ids)
        out.loss.backward()
        lora = peft_model.base_model.model.model.layers[0].self_attn.q_proj.lora_A["default"]
        results.append((out.logits, lora.weight.grad))
    for logits, grad in results[1:]:
        torch.testing.assert_close(logits, results[0][0], rtol=0, atol=1e-5)
        torch.testing.assert_close(grad, results[0][1], rtol=1e-4, atol=1e-6)
    # lm_head's 48 rows (and their backward) take 3 calls each instead of 1
    assert chunked_exec.calls >= whole_exec.calls + 4


@pytest.mark.parametrize("seed", [0, 1])
def test_a_bfloat16_executor_is_as_accurate_as_plain_peft_in_bfloat16(seed: int) -> None:
    """Both in bf16, each against plain peft in float32: ours' error at most twice plain's own
    (the two differ from each other by ~3% of the largest logit: other summation orders).
    The same check runs on a GPU under MPS (test_gpu_clients)."""
    errors = low_precision_errors("tiny-llama", "lora", LocalExecutor.load(
        "tiny-llama", dtype=torch.bfloat16), seed=seed)
    assert 0 < errors["plain"] < 0.1 * errors["largest"]  # bf16 did round, and not wildly
    assert 0 < errors["ours"] <= 2.0 * errors["plain"], errors

"""The independent reference: plain transformers + peft on the same weights, side by side.

`compare(model, method, handle)` builds a plain peft model and a split-execution one with the
same adapter weights, runs forward, backward and 3 AdamW steps on both, then greedy generation,
and returns the largest differences seen.
"""

from __future__ import annotations

import copy
import threading
from pathlib import Path
from typing import Any

import torch
from peft import (
    AdaLoraConfig,
    IA3Config,
    LoraConfig,
    PrefixTuningConfig,
    PromptTuningConfig,
    TaskType,
    get_peft_model,
)
from transformers import AutoModelForCausalLM

from catalogue.resolve import resolve_model
from workers.remote.build import remote_model
from workers.training.methods import recompute_layers

METHODS = ["lora", "ia3", "adalora", "prefix_tuning", "prompt_tuning"]
GPT2_FAMILY = ("tiny-gpt2", "tiny-starcoder")
TOLERANCE = 1e-5
_BUILDING = threading.Lock()


def peft_config(model: str, method: str, rank: int = 4):
    gpt2 = model in GPT2_FAMILY
    if method == "lora":
        return LoraConfig(task_type=TaskType.CAUSAL_LM, r=rank, lora_alpha=2 * rank,
                          target_modules="all-linear")
    if method == "lora_qv":  # the most common adapter: it leaves every stretch untouched
        return LoraConfig(task_type=TaskType.CAUSAL_LM, r=rank, lora_alpha=2 * rank,
                          target_modules=["c_attn"] if gpt2 else ["q_proj", "v_proj"])
    if method == "lora_qv_head":  # the same and the output head: the last stretch stops there
        return LoraConfig(task_type=TaskType.CAUSAL_LM, r=rank, lora_alpha=2 * rank,
                          target_modules=(["c_attn"] if gpt2 else ["q_proj", "v_proj"])
                          + ["lm_head"])
    if method == "lora_embed":  # the same and the token embedding: no lead
        return LoraConfig(task_type=TaskType.CAUSAL_LM, r=rank, lora_alpha=2 * rank,
                          target_modules=(["c_attn", "wte"] if gpt2 else
                                          ["q_proj", "v_proj", "embed_tokens"]))
    if method == "ia3":
        targets, ff = (["c_attn", "mlp.c_proj"], ["mlp.c_proj"]) if gpt2 else \
            (["k_proj", "v_proj", "down_proj"], ["down_proj"])
        return IA3Config(task_type=TaskType.CAUSAL_LM, target_modules=targets,
                         feedforward_modules=ff)
    if method == "adalora":
        targets = ["c_attn"] if gpt2 else ["q_proj", "v_proj"]
        return AdaLoraConfig(task_type=TaskType.CAUSAL_LM, init_r=rank, target_r=2,
                             total_step=10, target_modules=targets)
    if method == "prefix_tuning":
        return PrefixTuningConfig(task_type=TaskType.CAUSAL_LM, num_virtual_tokens=4)
    if method == "prompt_tuning":
        return PromptTuningConfig(task_type=TaskType.CAUSAL_LM, num_virtual_tokens=4)
    raise ValueError(method)


def build_pair(model: str, method: str, handle: Any, seed: int = 0, **remote_kwargs: Any):
    """(plain peft model, split-execution peft model) with identical, non-trivial adapters.
    One build at a time: building models (and seeding torch) is not thread-safe."""
    with _BUILDING:
        return _build_pair(model, method, handle, seed, **remote_kwargs)


def _build_pair(model: str, method: str, handle: Any, seed: int, **remote_kwargs: Any):
    config = peft_config(model, method)
    torch.manual_seed(seed)
    plain = get_peft_model(AutoModelForCausalLM.from_pretrained(resolve_model(model)),
                           copy.deepcopy(config))
    ours = get_peft_model(remote_model(model, handle, **remote_kwargs), copy.deepcopy(config))
    trainable = {n: p for n, p in ours.named_parameters() if p.requires_grad}
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in plain.named_parameters():
            if p.requires_grad:  # LoRA B starts at zero, IA3 at one: perturb so adapters matter
                p.add_(0.1 * torch.randn(p.shape, generator=generator))
                trainable.pop(name).copy_(p)
    assert not trainable, f"adapter parameters without a reference: {sorted(trainable)}"
    return plain, ours


def batch(seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, 50257, (2, 7), generator=generator)


def compare(model: str, method: str, handle: Any, steps: int = 3, seed: int = 0,
            device: str = "cpu", recompute: bool = False,
            **remote_kwargs: Any) -> dict[str, float | bool]:
    """Both models (and the reference) on `device`; the remote one's base layers wherever the
    executor computes; `recompute`: ours recomputes its layers in the backward, plain does not."""
    plain, ours = build_pair(model, method, handle, seed, device=device, **remote_kwargs)
    if recompute:
        recompute_layers(ours)
    plain.to(device)
    ids = batch(seed).to(device)
    result = {"logits": 0.0, "grads": 0.0, "params": 0.0}
    plain.train()
    ours.train()
    opts = [torch.optim.AdamW([p for p in m.parameters() if p.requires_grad], lr=1e-3)
            for m in (plain, ours)]
    for _ in range(steps):
        outs = [m(input_ids=ids, labels=ids) for m in (plain, ours)]
        result["logits"] = max(result["logits"], _diff(outs[0].logits, outs[1].logits))
        for out in outs:
            out.loss.backward()
        result["grads"] = max(result["grads"], _max_diff(plain, ours, grad=True))
        for opt in opts:
            opt.step()
            opt.zero_grad()
    result["params"] = _max_diff(plain, ours, grad=False)
    plain.eval()
    ours.eval()
    with torch.no_grad():
        gens = [m.generate(input_ids=ids[:1], max_new_tokens=8, do_sample=False,
                           min_new_tokens=8) for m in (plain, ours)]
    result["generate_equal"] = torch.equal(gens[0], gens[1])
    result["loss"] = float(outs[1].loss.detach())
    return result


def _diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.detach().float() - b.detach().float()).abs().max().item()


def _max_diff(plain, ours, grad: bool) -> float:
    theirs = {n: p for n, p in plain.named_parameters() if p.requires_grad}
    worst = 0.0
    for name, p in ours.named_parameters():
        if p.requires_grad:
            a, b = (theirs[name].grad, p.grad) if grad else (theirs[name], p)
            worst = max(worst, _diff(a, b))
    return worst


def low_precision_errors(model: str, method: str, handle: Any, seed: int = 0, rounds: int = 2,
                         device: str = "cpu") -> dict:
    """Ours in the executor's (low) precision against plain peft in the same precision, both
    measured against plain peft in float32 (the exact answer): the largest logit error of each.
    Low-precision results differ from one another by more than either's own error when
    summation orders differ (fused groups, other kernels), so what a test bounds is ours'
    error relative to plain's own, not the gap between the two."""
    plain, ours = build_pair(model, method, handle, seed, device=device)
    plain.to(device)
    batches = [torch.randint(0, 50257, (2, 48), generator=torch.Generator().manual_seed(seed + i))
               .to(device) for i in range(rounds)]
    with torch.no_grad():
        exact = [plain(input_ids=ids).logits for ids in batches]
        plain.to(handle.dtype)
        theirs = [plain(input_ids=ids).logits.float() for ids in batches]
        mine = [ours(input_ids=ids).logits.float() for ids in batches]
    return {"ours": max(_diff(a, b) for a, b in zip(exact, mine, strict=True)),
            "plain": max(_diff(a, b) for a, b in zip(exact, theirs, strict=True)),
            "between": max(_diff(a, b) for a, b in zip(theirs, mine, strict=True)),
            "largest": max(a.abs().max().item() for a in exact)}


def save_adapters(tmp_path_factory, model: str, adapters: dict[str, tuple[str, int]]
                  ) -> dict[str, Path]:
    """Each adapter (model id -> method, seed) over `model` saved as a PEFT directory, with
    non-trivial weights (peft's own initialization, plus seeded noise)."""
    base = AutoModelForCausalLM.from_pretrained(resolve_model(model))
    paths = {}
    for model_id, (method, seed) in adapters.items():
        torch.manual_seed(seed)
        peft = get_peft_model(copy.deepcopy(base), peft_config(model, method))
        with torch.no_grad():
            for p in peft.parameters():
                if p.requires_grad:
                    p.add_(0.3 * torch.randn_like(p))
        paths[model_id] = tmp_path_factory.mktemp(model_id.replace("/", "-").replace("@", "-"))
        peft.save_pretrained(paths[model_id])
    return paths


def embedding_of(model: Any, ids: list[int], dimensions: int = 0) -> torch.Tensor:
    """Plain transformers (+ peft) as an embedding's reference: the last layer's hidden state
    (after the final norm) at the prompt's last token, its first `dimensions` (all where 0), of
    length 1."""
    with torch.no_grad():
        out = model.eval()(input_ids=torch.tensor([ids]), output_hidden_states=True)
    state = out.hidden_states[-1][0, -1]
    state = state[:dimensions] if dimensions else state
    return state / state.norm()

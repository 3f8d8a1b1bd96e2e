"""A model that keeps less for the backward (`keep_less`) computes the same gradients, bit for
bit, as the same transformers + peft model without it, and holds less memory between its
forward and backward."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys

import pytest
import torch
from peft import IA3Config, LoraConfig, get_peft_model
from torch import nn
from transformers import AutoModelForCausalLM

from catalogue.resolve import resolve_model
from tests.workers.training.lean_probe import SHAPE, TOKENS
from workers.training.lean import Recipe, keep_less

CONFIGS = {"lora": lambda: LoraConfig(r=8, target_modules="all-linear"),
           "ia3-mlp": lambda: IA3Config(target_modules=["k_proj", "v_proj", "down_proj"],
                                        feedforward_modules=["down_proj"])}


def gradients(model: nn.Module, ids: torch.Tensor) -> tuple[float, dict[str, torch.Tensor]]:
    model.train()
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    return loss.item(), {n: p.grad for n, p in model.named_parameters() if p.requires_grad}


@pytest.mark.parametrize("name,method", [("tiny-llama", "lora"), ("tiny-llama", "ia3-mlp"),
                                         ("tiny-gemma2", "lora"), ("tiny-gpt2", "lora"),
                                         ("tiny-qwen2", "lora")])
def test_gradients_are_the_same_bit_for_bit(name: str, method: str) -> None:
    torch.manual_seed(0)
    if name == "tiny-gpt2":
        config = LoraConfig(r=8, target_modules=["c_attn", "c_proj", "c_fc"],
                            fan_in_fan_out=True)
    else:
        config = CONFIGS[method]()
    plain = get_peft_model(AutoModelForCausalLM.from_pretrained(resolve_model(name)), config)
    for parameter in plain.parameters():  # IA3 starts at ones, LoRA's B at zeros: move them
        if parameter.requires_grad:
            parameter.data.add_(0.1 * torch.randn_like(parameter))
    lean = copy.deepcopy(plain)
    recipes = keep_less(lean)
    kept_as_recipes = []
    pack = recipes.pack
    recipes.pack = lambda t: kept_as_recipes.append(isinstance(p := pack(t), Recipe)) or p
    ids = torch.randint(0, 100, (2, 24))
    loss, expected = gradients(plain, ids)
    lean_loss, got = gradients(lean, ids)
    assert lean_loss == loss
    assert expected.keys() == got.keys() and len(got) > 0
    for name_, grad in expected.items():
        assert torch.equal(got[name_], grad), name_
    assert sum(kept_as_recipes) >= 2 * lean.config.num_hidden_layers  # it did keep less


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_in_bfloat16_gradients_differ_no_more_than_plain_from_itself(device: str) -> None:
    """On a GPU a kernel may add in any order (attention's backward), so plain peft is run twice:
    keeping less may differ from it by no more than it differs from itself (on a CPU: not at
    all)."""
    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(resolve_model("tiny-llama"), dtype=torch.bfloat16)
    plain = get_peft_model(base.to(device), CONFIGS["lora"]())
    for parameter in plain.parameters():
        if parameter.requires_grad:
            parameter.data.add_(0.1 * torch.randn_like(parameter))
    lean = copy.deepcopy(plain)
    keep_less(lean)
    ids = torch.randint(0, 100, (2, 24), device=device)
    runs = []
    for model in (plain, plain, lean):
        loss, grads = gradients(model, ids)
        runs.append((loss, {name: grad.clone() for name, grad in grads.items()}))
        model.zero_grad(set_to_none=True)
    (first_loss, first), (again_loss, again), (lean_loss, got) = runs
    assert abs(lean_loss - first_loss) <= abs(again_loss - first_loss)
    for name, grad in first.items():
        spread = (again[name].float() - grad.float()).abs().max()
        assert (got[name].float() - grad.float()).abs().max() <= spread, name
        if device == "cpu":
            assert torch.equal(got[name], grad), name


class Scaled(nn.Module):
    """A norm whose output is changed in place before a trained layer saves it."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(16)
        self.proj = nn.Linear(16, 16)
        self.act_fn = nn.SiLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(x)
        h.mul_(3.0)
        a = self.act_fn(h)
        return self.proj(a).sum() + (a * a).sum()


def test_an_output_changed_in_place_is_kept_itself() -> None:
    torch.manual_seed(0)
    plain = Scaled()
    lean = copy.deepcopy(plain)
    recipes = keep_less(lean)
    made = []
    pack = recipes.pack
    recipes.pack = lambda t: made.append(isinstance(p := pack(t), Recipe)) or p
    x = torch.randn(4, 16, requires_grad=True)
    plain(x).backward()
    lean(x.detach().requires_grad_()).backward()
    for (name, a), b in zip(plain.named_parameters(), lean.parameters(), strict=True):
        assert torch.equal(a.grad, b.grad), name
    assert any(made) and not all(made)  # the activation's output is a recipe, the norm's not


def test_nothing_is_recorded_without_autograd() -> None:
    model = AutoModelForCausalLM.from_pretrained(resolve_model("tiny-llama"))
    recipes = keep_less(model)
    with torch.no_grad():
        model(input_ids=torch.tensor([[1, 2, 3]]))
    assert not recipes._made


def _held(mode: str) -> int:
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "OMP_NUM_THREADS": "1"}
    run = subprocess.run([sys.executable, "-m", "tests.workers.training.lean_probe", mode],
                         capture_output=True, text=True, timeout=300, env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])["held"]


@pytest.mark.slow
def test_a_training_forward_holds_less_memory() -> None:
    """Per decoder layer, the two norms' outputs (tokens x hidden each) and the MLP's
    activation and product (tokens x intermediate each) are no longer held: at least 80% of
    that is given back, measured as resident memory after the forward."""
    plain, lean = _held("plain"), _held("lean")
    tokens = TOKENS[0] * TOKENS[1]
    per_layer = 4 * tokens * (2 * SHAPE["hidden_size"] + 2 * SHAPE["intermediate_size"])
    saved = SHAPE["num_hidden_layers"] * per_layer  # 31 MB; plain holds ~75 MB
    assert plain - lean >= 0.8 * saved, (plain, lean, saved)
    assert lean > 0.2 * plain  # what stays (attention's, the residual stream's) is still held


def test_a_recipe_whose_input_changed_in_place_refuses_as_a_saved_tensor_would() -> None:
    gate, up = torch.randn(3, 4), torch.randn(3, 4)
    recipe = Recipe(lambda g, u: torch.nn.functional.silu(g) * u, (gate, up), torch.Size([12]))
    assert torch.equal(recipe(), (torch.nn.functional.silu(gate) * up).view(12))
    up.add_(1.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        recipe()

"""A stretch runs its norms and activation without their module calls (fewer tensor ops): the
results must be those of the models' own modules, bit for bit; the kept stretch's backward
takes their gradients by formula (RMS norm, gated SiLU): autograd's through those modules, to
rounding."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from transformers import AutoModelForCausalLM

from catalogue.resolve import resolve_model
from catalogue.stretches import RECIPES
from executor.elementwise import (
    RMSNorm,
    act_grad,
    activation_function,
    gated_grad,
    norm_function,
    norm_grad,
)
from wire.call.threads import SPLIT_MIN

MODELS = ["tiny-llama", "tiny-qwen2", "tiny-mistral", "tiny-gpt2"]


def one_thread_rows(hidden: int) -> int:
    """Rows enough that a norm over them runs on one thread (`copy_threads`: torch would split
    it, and a second thread's wake-up costs more than its half)."""
    return SPLIT_MIN // hidden + 1


def first_layer(name: str):
    """The model's recipe and its first decoder layer; the seed set."""
    model = AutoModelForCausalLM.from_pretrained(resolve_model(name)).eval()
    recipe = RECIPES[model.config.model_type]
    torch.manual_seed(0)
    return recipe, model.get_submodule(recipe.layers)[0]


@pytest.mark.parametrize("name", MODELS)
def test_norms_and_activation_equal_the_modules_bit_for_bit(name: str) -> None:
    recipe, layer = first_layer(name)
    for module in (layer.get_submodule(recipe.post_norm), layer.get_submodule(recipe.in_norm)):
        with torch.no_grad():  # a trained norm's weight is not all ones
            module.weight.uniform_(0.5, 1.5)
        fast = norm_function(module)
        assert fast is not module  # every recipe's norm has a direct form
        hidden = module.weight.shape[0]
        for rows in (1, 3, 64, one_thread_rows(hidden)):
            h = torch.randn(rows, hidden) * 3
            assert torch.equal(fast(h), module(h))
    act = layer.get_submodule(recipe.act)
    x = torch.randn(5, 32) * 4
    assert torch.equal(activation_function(act)(x), act(x))


def test_an_unknown_norm_runs_as_its_module() -> None:
    class ScaledNorm(nn.Module):
        def forward(self, h: torch.Tensor) -> torch.Tensor:
            return 2 * h

    module = ScaledNorm()
    assert norm_function(module) is module
    silu = nn.SiLU(inplace=True)  # changes its input: not the out-of-place F.silu
    assert activation_function(silu) is silu


@pytest.mark.parametrize("name", MODELS)
def test_gradients_equal_autograds_through_the_modules(name: str) -> None:
    recipe, layer = first_layer(name)
    norm = layer.get_submodule(recipe.post_norm)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
    fast = norm_function(norm)
    assert isinstance(fast, RMSNorm) == (name != "tiny-gpt2")  # GPT-2's LayerNorm: autograd
    hidden = norm.weight.shape[0]
    for rows in (9, one_thread_rows(hidden)):
        h, grad = torch.randn(rows, hidden) * 3, torch.randn(rows, hidden)
        leaf = h.clone().requires_grad_(True)
        (expected,) = torch.autograd.grad(norm(leaf), leaf, grad)
        torch.testing.assert_close(norm_grad(fast, h, grad), expected, rtol=1e-5, atol=1e-6)
    act = layer.get_submodule(recipe.act)
    u, grad = torch.randn(9, 2, 48) * 3, torch.randn(9, 48)
    gate, up = u[:, 0].clone().requires_grad_(True), u[:, 1].clone().requires_grad_(True)
    if name == "tiny-gpt2":  # ungated: m = act(u)
        (expected,) = torch.autograd.grad(act(gate), gate, grad)
        torch.testing.assert_close(act_grad(activation_function(act), u[:, 0], grad), expected)
        return
    assert activation_function(act) is F.silu
    expected = torch.autograd.grad(act(gate) * up, (gate, up), grad)
    got = gated_grad(activation_function(act), u[:, 0], u[:, 1], grad)
    for mine, theirs in zip(got, expected, strict=True):
        torch.testing.assert_close(mine, theirs, rtol=1e-5, atol=1e-6)


def test_a_norm_in_another_dtype_or_unknown_takes_autograd() -> None:
    class ScaledNorm(nn.Module):
        def forward(self, h: torch.Tensor) -> torch.Tensor:
            return 2 * h * h

    h, grad = torch.randn(4, 8), torch.randn(4, 8)
    torch.testing.assert_close(norm_grad(ScaledNorm(), h, grad), 4 * h * grad)
    model = AutoModelForCausalLM.from_pretrained(resolve_model("tiny-llama"))
    module = model.get_submodule("model.norm").to(torch.bfloat16)
    h16, g16 = torch.randn(4, 64, dtype=torch.bfloat16), torch.randn(4, 64, dtype=torch.bfloat16)
    leaf = h16.clone().requires_grad_(True)
    (expected,) = torch.autograd.grad(module(leaf), leaf, g16)
    assert torch.equal(norm_grad(norm_function(module), h16, g16), expected)

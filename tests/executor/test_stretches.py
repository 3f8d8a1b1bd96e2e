"""A stretch runs its norms and activation without their module calls (fewer tensor ops): the
results must be those of the models' own modules, bit for bit."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from transformers import AutoModelForCausalLM

from catalogue.resolve import resolve_model
from catalogue.stretches import RECIPES
from executor.stretches import activation_function, norm_function


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen2", "tiny-mistral", "tiny-gpt2"])
def test_norms_and_activation_equal_the_modules_bit_for_bit(name: str) -> None:
    model = AutoModelForCausalLM.from_pretrained(resolve_model(name)).eval()
    recipe = RECIPES[model.config.model_type]
    layer = model.get_submodule(recipe.layers)[0]
    torch.manual_seed(0)
    for module in (layer.get_submodule(recipe.post_norm), layer.get_submodule(recipe.in_norm)):
        with torch.no_grad():  # a trained norm's weight is not all ones
            module.weight.uniform_(0.5, 1.5)
        fast = norm_function(module)
        assert fast is not module  # every recipe's norm has a direct form
        for rows in (1, 3, 64):
            h = torch.randn(rows, module.weight.shape[0]) * 3
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


@pytest.mark.parametrize("shape", [(64, 64), (768, 768), (50259, 64)])
def test_every_matmul_route_has_a_gradient_when_autograd_asks(shape: tuple[int, int]) -> None:
    """A stretch's backward differentiates its forward: the oneDNN route (large weights) has no
    autograd formula, so such products must go another way."""
    from executor.kernels import linear

    weight = torch.randn(shape)
    x = torch.randn(3, shape[1], requires_grad=True)
    grad = torch.randn(3, shape[0])
    (got,) = torch.autograd.grad(linear(x, weight), x, grad)
    torch.testing.assert_close(got, grad @ weight)

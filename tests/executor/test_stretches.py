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


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen2", "tiny-gpt2"])
def test_a_stretch_backward_is_autograd_through_its_forward_with_less_recomputed(name) -> None:
    """The backward takes [inputs | the forward's residual output | output gradients]: its input
    gradients equal autograd's through the forward (which equals the model's modules: the test
    above and tests/workers/remote/test_stretch.py), while it computes neither the down
    projection's nor the next q/k/v's products again."""
    from torch.utils.flop_counter import FlopCounterMode

    from executor.registry import LayerRegistry
    from wire.call.messages import LayerKind

    registry = LayerRegistry.load(resolve_model(name))
    specs = [s for s in registry.specs if s.kind == LayerKind.STRETCH]
    assert len(specs) >= 3  # every layer's, and the last one's through the head
    torch.manual_seed(0)
    for spec in specs:
        stretch = registry.get(spec.index).stretch
        inputs = torch.randn(7, spec.in_features)
        grad = torch.randn(7, spec.out_features)
        with torch.enable_grad(), FlopCounterMode(display=False) as through_forward:
            leaf = inputs.clone().requires_grad_(True)
            out = stretch(leaf)
            (expected,) = torch.autograd.grad(out, leaf, grad)
        hidden = spec.splits[0]
        with FlopCounterMode(display=False) as backward:
            got = stretch.backward(torch.cat([inputs, out[:, :hidden].detach(), grad], dim=1))
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)  # to rounding
        skipped = 2 * 7 * (stretch.down.spec.in_features * stretch.down.spec.out_features + sum(
            t.spec.in_features * t.spec.out_features
            for t in (stretch.targets if stretch.in_norm is not None else [])))
        assert backward.get_total_flops() == through_forward.get_total_flops() - skipped

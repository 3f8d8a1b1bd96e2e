"""A stretch's backward: input gradients as autograd's through its forward, computing less."""

from __future__ import annotations

import pytest
import torch

from catalogue.resolve import resolve_model


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

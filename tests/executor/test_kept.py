"""A kept stretch: its forward is the stretch's result, bit for bit, with the residual before
the MLP and the MLP's input products as the model's modules compute them; its backward, given
those back, equals autograd's input gradients through the stretch (to rounding) and computes
each product once, none of the forward's again."""

from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode
from transformers import AutoModelForCausalLM

from catalogue.resolve import resolve_model
from catalogue.stretches import RECIPES
from executor.registry import LayerRegistry
from executor.scheduling import stretch_macs
from executor.validation import CallTable
from wire.call.messages import LayerKind, Op


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen2", "tiny-gpt2"])
def test_forward_hands_back_the_modules_products_and_backward_equals_autograd(name) -> None:
    model = AutoModelForCausalLM.from_pretrained(resolve_model(name)).eval()
    recipe = RECIPES[model.config.model_type]
    decoder = model.get_submodule(recipe.layers)
    registry = LayerRegistry.load(resolve_model(name))
    kept = [s for s in registry.specs if s.kind == LayerKind.KEPT]
    assert [s.name for s in kept] == [f"{recipe.layers}.{i}.stretch+kept"
                                      for i in range(len(decoder))]  # none through the head
    torch.manual_seed(0)
    for i, spec in enumerate(kept):
        layer = registry.get(spec.index).stretch
        stretch = registry.by_name[spec.name.removesuffix("+kept")]
        block = decoder[i]
        x = torch.randn(7, spec.in_features)
        out = registry.run(Op.FORWARD, registry.get(spec.index), x)
        width, hidden = stretch.spec.out_features, spec.splits[0]
        assert out.shape[1] == spec.out_features == width + spec.splits[-1]
        assert torch.equal(out[:, :width], registry.run(Op.FORWARD, stretch, x))
        attn, residual = x.split([spec.in_features - hidden, hidden], dim=1)
        with torch.no_grad():
            h = residual + block.get_submodule(recipe.o)(attn)
            n = block.get_submodule(recipe.post_norm)(h)
            u = torch.cat([block.get_submodule(m)(n) for m in recipe.mlp_in], dim=1)
        torch.testing.assert_close(out[:, width:], torch.cat([h, u], dim=1), rtol=0, atol=1e-6)

        grad = torch.randn(7, width)
        with torch.enable_grad():
            leaf = x.clone().requires_grad_(True)
            (expected,) = torch.autograd.grad(stretch.stretch(leaf), leaf, grad)
        given = torch.cat([out[:, :hidden], grad, out[:, width:]], dim=1)
        assert given.shape[1] == CallTable(registry.specs).layers[spec.index].widths[
            Op.BACKWARD][0]  # the width the executor accepts
        with FlopCounterMode(display=False) as backward:
            got = registry.run(Op.BACKWARD, registry.get(spec.index), given)
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
        assert backward.get_total_flops() == 2 * 7 * stretch_macs(layer)  # each product once

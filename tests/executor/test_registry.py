"""The executor's layer registry against the model's own modules."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM
from transformers.pytorch_utils import Conv1D

from catalogue.base_layers import base_layer_names
from catalogue.resolve import resolve_model
from executor.registry import LayerRegistry, UnsupportedOp
from tests.conftest import TINY_MODELS
from wire.call.messages import LayerKind, Op


@pytest.mark.parametrize("name", TINY_MODELS)
def test_every_weight_bearing_layer_is_served_exactly(name: str) -> None:
    model = AutoModelForCausalLM.from_pretrained(resolve_model(name))
    registry = LayerRegistry.load(resolve_model(name))
    modules = dict(model.named_modules())
    fused = (LayerKind.GROUP, LayerKind.STRETCH, LayerKind.LEAD, LayerKind.GREEDY,
             LayerKind.LOSS, LayerKind.KEPT)
    assert [s.name for s in registry.specs if s.kind not in fused] == base_layer_names(model)
    torch.manual_seed(0)
    for layer in registry.layers:
        spec = layer.spec
        if spec.kind in (LayerKind.STRETCH, LayerKind.LEAD, LayerKind.GREEDY, LayerKind.LOSS,
                         LayerKind.KEPT):
            continue  # test_stretches_equal_..., tests/executor/test_loss.py, test_kept.py
        if spec.kind == LayerKind.GROUP:
            members = [modules[m] for m in spec.members]
            x = torch.randn(5, spec.in_features)
            expected = torch.cat([m(x) for m in members], dim=1)
            torch.testing.assert_close(registry.run(Op.FORWARD, layer, x), expected)
            continue
        module = modules[spec.name]
        if spec.kind == LayerKind.EMBEDDING:
            ids = torch.randint(0, spec.in_features, (6,))
            assert torch.equal(registry.run(Op.FORWARD, layer, ids), module(ids))
            with pytest.raises(UnsupportedOp):
                registry.run(Op.BACKWARD, layer, ids)
            continue
        x = torch.randn(5, spec.in_features, requires_grad=True)
        y = module(x)
        # oneDNN and MKL block differently: equal up to float32 rounding, not bitwise
        torch.testing.assert_close(registry.run(Op.FORWARD, layer, x.detach()), y.detach())
        weight = module.weight.t() if isinstance(module, Conv1D) else module.weight
        torch.testing.assert_close(registry.run(Op.FORWARD_NOBIAS, layer, x.detach()),
                                   F.linear(x.detach(), weight))
        grad = torch.randn_like(y)
        y.backward(grad)
        # grad_x sums over out_features (50k for lm_head): rounding grows with the length
        tolerance = 1e-6 * spec.out_features ** 0.5
        torch.testing.assert_close(registry.run(Op.BACKWARD, layer, grad), x.grad,
                                   rtol=tolerance, atol=tolerance)


def test_groups_share_inputs_and_cost_no_memory() -> None:
    fused = LayerRegistry.load(resolve_model("tiny-llama"))
    plain = LayerRegistry.load(resolve_model("tiny-llama"), fuse=False)
    groups = [s for s in fused.specs if s.kind == LayerKind.GROUP]
    assert [g.members for g in groups][:2] == [
        tuple(f"model.layers.0.self_attn.{p}_proj" for p in "qkv"),
        ("model.layers.0.mlp.gate_proj", "model.layers.0.mlp.up_proj"),
    ]
    assert groups[0].splits == (64, 32, 32)
    assert fused.parameter_bytes() == plain.parameter_bytes()


def test_tied_weights_are_stored_once() -> None:
    registry = LayerRegistry.load(resolve_model("tiny-gpt2"))
    model = AutoModelForCausalLM.from_pretrained(resolve_model("tiny-gpt2"))
    assert registry.by_name["lm_head"].weight.data_ptr() == \
        registry.by_name["transformer.wte"].weight.data_ptr()
    full = sum(p.numel() * p.element_size() for p in model.parameters())
    norms = sum(p.numel() * p.element_size() for n, p in model.named_parameters() if "ln" in n)
    assert registry.parameter_bytes() == full - norms


def test_bfloat16_registry_runs_in_bfloat16() -> None:
    registry = LayerRegistry.load(resolve_model("tiny-qwen2"), dtype=torch.bfloat16)
    layer = registry.by_name["model.layers.0.self_attn.q_proj"]
    assert layer.weight.dtype == torch.bfloat16
    assert registry.run(Op.FORWARD, layer, torch.randn(2, 64, dtype=torch.bfloat16)).dtype \
        == torch.bfloat16


@pytest.mark.parametrize("rows", [1, 7, 64, 65, 300])
def test_small_and_large_batches_agree_with_plain_linear(rows: int) -> None:
    registry = LayerRegistry.load(resolve_model("tiny-qwen2"))
    layer = registry.by_name["model.layers.0.self_attn.q_proj"]
    x, g = torch.randn(rows, 64), torch.randn(rows, 64)
    torch.testing.assert_close(registry.run(Op.FORWARD, layer, x),
                               F.linear(x, layer.weight, layer.bias))
    torch.testing.assert_close(registry.run(Op.BACKWARD, layer, g), g @ layer.weight)


def test_loaded_registry_keeps_no_map_of_the_checkpoint() -> None:
    """Every page of the checkpoint is read while loading; a map kept open would hold them all
    resident next to the fused q/k/v and gate/up copies (1.7x the weights for a Llama)."""
    checkpoint = resolve_model("tiny-llama") / "model.safetensors"
    script = (
        "import gc, sys; from executor.registry import LayerRegistry; "
        f"r = LayerRegistry.load({str(checkpoint.parent)!r}); gc.collect(); "
        f"maps = open('/proc/self/maps').read(); "
        "sys.stdout.write(str(len(r.layers)) + ' ' + str(maps.count('model.safetensors')))")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         check=True, cwd=Path(__file__).parents[2]).stdout.split()
    layers, mapped = int(out[0]), int(out[1])
    assert layers > 10 and mapped == 0


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-gpt2", "tiny-qwen2", "tiny-mistral"])
def test_stretches_equal_the_decoder_layers_they_stand_for(name: str) -> None:
    """A stretch = output projection, residual, norm, MLP, residual, the next layer's input norm
    and q/k/v, computed here with the model's own modules; the last layer's second one goes on
    through the final norm and the output head; greedy goes on from there to the lead of each
    row's greedy choice."""
    from catalogue.stretches import RECIPES

    model = AutoModelForCausalLM.from_pretrained(resolve_model(name)).eval()
    recipe = RECIPES[model.config.model_type]
    decoder = model.get_submodule(recipe.layers)
    registry = LayerRegistry.load(resolve_model(name))
    stretches = [layer for layer in registry.layers if layer.spec.kind == LayerKind.STRETCH]
    assert len(stretches) == len(decoder) + 1
    assert stretches[-1].spec.name == f"{recipe.layers}.{len(decoder) - 1}.stretch+lm_head"
    torch.manual_seed(0)
    for i, layer in enumerate(stretches):
        block = decoder[min(i, len(decoder) - 1)]
        o = block.get_submodule(recipe.o)
        attn = torch.randn(3, layer.spec.in_features - layer.spec.splits[0], requires_grad=True)
        residual = torch.randn(3, layer.spec.splits[0], requires_grad=True)
        h = residual + o(attn)
        n = block.get_submodule(recipe.post_norm)(h)
        mlp = block.get_submodule(recipe.mlp_in[0].rsplit(".", 1)[0])
        h = h + mlp(n)
        expected = [h]
        if i + 1 < len(decoder):  # the stream, its norm for the next layer, the next q/k/v
            following = decoder[i + 1]
            n = following.get_submodule(recipe.in_norm)(h)
            expected += [n, *(following.get_submodule(q)(n) for q in recipe.qkv)]
        elif i == len(decoder):
            n = model.get_submodule(recipe.final_norm)(h)
            expected += [n, model.lm_head(n)]
        expected = torch.cat(expected, dim=1)
        inputs = torch.cat([attn, residual], dim=1).detach()
        torch.testing.assert_close(registry.run(Op.FORWARD, layer, inputs), expected.detach())
        grad = torch.randn_like(expected)
        grads = torch.cat(torch.autograd.grad(expected, (attn, residual), grad), dim=1)
        out = expected[:, :layer.spec.splits[0]].detach()  # the residual output comes along
        got = registry.run(Op.BACKWARD, layer, torch.cat([inputs, out, grad], dim=1))
        torch.testing.assert_close(got, grads)
        with pytest.raises(UnsupportedOp):
            registry.run(Op.FORWARD_NOBIAS, layer, inputs)
    leads = [layer for layer in registry.layers if layer.spec.kind == LayerKind.LEAD]
    assert len(leads) == (recipe.embed != "")  # GPT-2 adds positions before its first norm

    def lead_of(ids: torch.Tensor) -> torch.Tensor:
        h = model.get_submodule(recipe.embed)(ids)
        n = decoder[0].get_submodule(recipe.in_norm)(h)
        return torch.cat([h, n, *(decoder[0].get_submodule(q)(n) for q in recipe.qkv)], dim=1)

    for lead in leads:  # the embedding, then the first layer's input norm and q/k/v
        assert lead.spec.name == f"{recipe.embed}.lead"
        ids = torch.randint(0, lead.spec.in_features, (7,))
        h = model.get_submodule(recipe.embed)(ids)
        torch.testing.assert_close(registry.run(Op.FORWARD, lead, ids), lead_of(ids).detach())
        widths = [decoder[0].get_submodule(q).out_features for q in recipe.qkv]
        # the embedding, its norm, q/k/v as their fused group
        assert lead.spec.splits == (h.shape[1], h.shape[1], sum(widths))
        with pytest.raises(UnsupportedOp):
            registry.run(Op.BACKWARD, lead, ids)
    greedy = [layer for layer in registry.layers if layer.spec.kind == LayerKind.GREEDY]
    assert len(greedy) == len(leads)
    tail = stretches[-1]
    for layer in greedy:  # tail, the choice in base-256 digits, the lead of the choice
        assert layer.spec.name == f"{tail.spec.name}+lead"
        assert layer.spec.splits == (*tail.spec.splits, 3, *leads[0].spec.splits)
        inputs = torch.randn(4, layer.spec.in_features)
        with torch.no_grad():
            head = registry.run(Op.FORWARD, tail, inputs)
            choices = head[:, -model.lm_head.out_features:].argmax(dim=1)
            digits = torch.tensor([[i // 65536, i // 256 % 256, i % 256]
                                   for i in choices.tolist()], dtype=torch.float32)
            expected = torch.cat([head, digits, lead_of(choices)], dim=1)
        assert len(set(choices.tolist())) > 1  # each row's own choice
        torch.testing.assert_close(registry.run(Op.FORWARD, layer, inputs), expected)
        with pytest.raises(UnsupportedOp):
            registry.run(Op.BACKWARD, layer, torch.cat([inputs, expected], dim=1))

"""RowAdapters: each row of a batch through its own adapter, as peft's `adapter_names` argument
does it (the reference), with hooks placed once, on the modules a later adapter adds too."""

from __future__ import annotations

import pytest
import torch
from peft import LoraConfig, get_peft_model
from peft.tuners.lora import Linear as LoraLinear
from transformers import AutoModelForCausalLM

from catalogue.resolve import resolve_model
from tests.peft_reference import peft_config
from workers.inference.rows import RowAdapters

MODEL = "tiny-llama"


def _perturbed(model, name: str, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for key, p in model.named_parameters():
            if f".{name}." in key:
                p.add_(0.3 * torch.randn(p.shape, generator=generator))


def test_rows_go_through_their_own_adapters_exactly_as_peft_names_them() -> None:
    torch.manual_seed(0)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(resolve_model(MODEL)),
                           peft_config(MODEL, "lora_qv"), adapter_name="qv").eval()
    _perturbed(model, "qv", 1)
    rows = RowAdapters(model)
    unhooked = sum(len(m._forward_pre_hooks) for m in model.modules())
    ids = torch.tensor([[5, 6, 7, 8], [9, 10, 11, 12], [13, 14, 15, 16]])

    def ours(adapters):
        with torch.no_grad(), rows.select(adapters):
            return model(input_ids=ids[:len(adapters)]).logits

    def peft(names):
        with torch.no_grad():
            return model(input_ids=ids[:len(names)], adapter_names=names).logits

    # mixed rows: each row's delta as peft's up to the order of float additions (lora_rows.py;
    # bit for bit on some CPUs, not on an AVX-512 Xeon, whose matmuls block by shape)
    torch.testing.assert_close(ours(["qv", None]), peft(["qv", "__base__"]), rtol=1e-5,
                               atol=1e-5)
    model.add_adapter("all", peft_config(MODEL, "lora"))  # wraps modules "qv" left alone
    _perturbed(model, "all", 2)
    mixed = ours(["all", "qv", None])
    torch.testing.assert_close(mixed, peft(["all", "qv", "__base__"]), rtol=1e-5, atol=1e-5)
    assert not torch.equal(mixed[0], mixed[1]) and not torch.equal(mixed[1], mixed[2])
    hooks = sum(len(m._forward_pre_hooks) for m in model.modules())
    ours(["qv", "all"])
    assert sum(len(m._forward_pre_hooks) for m in model.modules()) == hooks  # placed once
    assert torch.equal(ours(["all", "all"]), peft(["all", "all"]))  # one adapter: peft's path
    with torch.no_grad():  # outside a selection the hooks change nothing
        model.set_adapter("qv")
        assert torch.equal(model(input_ids=ids[:1]).logits, peft(["qv"]))
    with pytest.raises(ValueError, match="no adapter named typo"):
        ours(["typo", None])
    rows.close()  # the engine moved on: no hook of ours is left behind
    assert sum(len(m._forward_pre_hooks) for m in model.modules()) == unhooked


def test_lora_linears_add_each_rows_delta_in_two_matmuls_as_peft_would() -> None:
    """Adapters of different ranks, scalings and modules, base-model rows and an adapter with
    biases on B (its modules keep peft's path) in one batch; a new version loaded into an
    adapter's tensors in place is picked up."""
    torch.manual_seed(0)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(resolve_model(MODEL)),
                           peft_config(MODEL, "lora_qv", rank=2), adapter_name="qv").eval()
    model.add_adapter("all", peft_config(MODEL, "lora", rank=8))
    model.add_adapter("wide", LoraConfig(r=4, lora_alpha=3, target_modules="all-linear"))
    for seed, name in enumerate(("qv", "all", "wide")):
        _perturbed(model, name, seed)
    rows = RowAdapters(model)
    ids = torch.randint(0, 100, (5, 6), generator=torch.Generator().manual_seed(1))
    adapters = ["all", "qv", None, "wide", "all"]
    names = [a or "__base__" for a in adapters]

    def both():
        with torch.no_grad():
            with rows.select(adapters):
                ours = model(input_ids=ids).logits
            return ours, model(input_ids=ids, adapter_names=names).logits

    ours, peft = both()
    torch.testing.assert_close(ours, peft, rtol=1e-5, atol=1e-5)
    linears = sum(isinstance(m, LoraLinear) for m in model.modules())
    assert len(rows.stacks) == linears  # every LoRA Linear took the two-matmul path
    base = model.get_base_model()
    with torch.no_grad(), model.disable_adapter():
        plain = base(input_ids=ids).logits
    torch.testing.assert_close(ours[2], plain[2], rtol=1e-5, atol=1e-5)  # the base row: none
    assert all(not torch.allclose(ours[k], plain[k], atol=1e-3) for k in (0, 1, 3, 4))
    _perturbed(model, "wide", 9)  # in place, as a version loaded over the old tensors
    again, peft = both()
    torch.testing.assert_close(again, peft, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(again[3], ours[3])
    model.delete_adapter("wide")  # and a new one under its name, before the next forward
    model.add_adapter("wide", LoraConfig(r=4, lora_alpha=5, target_modules="all-linear"))
    _perturbed(model, "wide", 7)
    renewed, peft = both()
    torch.testing.assert_close(renewed, peft, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(renewed[3], again[3])
    model.add_adapter("bias", LoraConfig(r=2, target_modules=["q_proj"], lora_bias=True))
    _perturbed(model, "bias", 5)
    adapters[1] = names[1] = "bias"
    ours, peft = both()
    torch.testing.assert_close(ours, peft, rtol=1e-5, atol=1e-5)
    assert len(rows.stacks) == linears - sum(  # the q_proj modules that hold it: peft's path
        isinstance(m, LoraLinear) and "bias" in m.lora_A for m in model.modules())

"""RowAdapters: each row of a batch through its own adapter, as peft's `adapter_names` argument
does it (the reference), with hooks placed once, on the modules a later adapter adds too."""

from __future__ import annotations

import pytest
import torch
from peft import get_peft_model
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

    assert torch.equal(ours(["qv", None]), peft(["qv", "__base__"]))
    model.add_adapter("all", peft_config(MODEL, "lora"))  # wraps modules "qv" left alone
    _perturbed(model, "all", 2)
    mixed = ours(["all", "qv", None])
    assert torch.equal(mixed, peft(["all", "qv", "__base__"]))
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

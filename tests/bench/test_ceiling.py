"""bench.ceiling: a plain job whose frozen linear layers cost nothing still runs the rest of a
training step (its logits are all zero, so its loss is ln(vocabulary)), and the ceiling adds the
base FLOPs at peak to the time the rest took."""

import math

import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM

from bench.ceiling import ceiling, free_base
from catalogue.resolve import resolve_model


def test_free_base_swaps_each_frozen_linear_and_the_step_still_runs() -> None:
    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(resolve_model("tiny-llama"))
    config = base.config
    model = get_peft_model(base, LoraConfig(task_type="CAUSAL_LM", r=4,
                                            target_modules=["q_proj", "v_proj"]))
    # 7 projections per decoder layer (q/v as the LoRA wrappers' base layers) and the lm_head
    assert free_base(model) == 7 * config.num_hidden_layers + 1
    ids = torch.randint(0, config.vocab_size, (2, 16))
    output = model(input_ids=ids, labels=ids)
    assert torch.count_nonzero(output.logits) == 0
    assert math.isclose(output.loss.item(), math.log(config.vocab_size), rel_tol=1e-6)
    output.loss.backward()
    adapters = [p for p in model.parameters() if p.requires_grad]
    assert adapters and all(p.grad is not None for p in adapters)


def test_ceiling_adds_the_base_flops_at_peak_to_the_rest() -> None:
    # the rest takes 10 ms a token; 1 GFLOP a token at 100 GFLOP/s takes 10 ms more
    assert math.isclose(ceiling(100.0, 1e9, 100.0), 50.0)
    assert ceiling(100.0, 0.0, 100.0) == 100.0

"""The default jobs at once: a count by the cores, and a memory budget they share; a job counted
at its most for the model's shape, less when it recomputes its layers."""

from __future__ import annotations

import json

from catalogue.builtin import BUILTINS
from workers.manager.capacity import (
    TRAINER_PROCESS_BYTES,
    JobBudget,
    Shape,
    default_capacity,
    job_bytes,
    job_capacity,
    model_shape,
)

GIB = 2**30


def test_a_jobs_most_is_its_process_a_micro_batchs_activations_and_its_logits() -> None:
    llama_1b = model_shape("llama-1b")
    assert llama_1b == Shape(2048, 22, BUILTINS["llama-1b"].config["vocab_size"])
    # 4096 tokens: 34 x 2048 x 22 values a token at 2 bytes each (16-bit count, fp32 here x2)
    activations = 4096 * 34 * 2048 * 22 * 2
    logits = 3 * 4096 * llama_1b.vocab * 4
    assert job_bytes(llama_1b) == TRAINER_PROCESS_BYTES + activations + logits
    assert 14 * GIB < job_bytes(llama_1b) < 15 * GIB  # the 1B model's micro-batch dominates


def test_the_shape_is_read_from_a_config_or_the_catalogue(tmp_path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"n_embd": 768, "n_layer": 12,
                                                      "vocab_size": 50257}))
    assert model_shape(str(tmp_path)) == Shape(768, 12, 50257)
    assert model_shape("tiny-gpt2") == Shape(64, 2, BUILTINS["tiny-gpt2"].config["vocab_size"])
    assert model_shape(str(tmp_path / "missing")) is None


def test_recomputing_layers_keeps_each_layers_input_and_one_layers_activations() -> None:
    llama_1b = model_shape("llama-1b")
    value = 4096 * 2048 * 2  # a token's hidden unit over the micro-batch, as the paper counts
    assert job_bytes(llama_1b) - job_bytes(llama_1b, recompute=True) == \
        (34 * 22 - (34 + 2 * 22)) * value
    assert job_bytes(llama_1b, recompute=True) < 0.6 * job_bytes(llama_1b)


def test_the_cores_count_the_jobs_and_half_the_memory_is_their_budget() -> None:
    each = job_bytes(model_shape("llama-1b"))
    count, budget = default_capacity("llama-1b", cores=16, available_bytes=6 * each)
    assert count == 8 and budget == JobBudget(3 * each, model_shape("llama-1b"))
    assert budget.cost(False) == each and budget.cost(True) < each
    assert default_capacity("no-such-model", cores=6, available_bytes=0) == (3, None)
    assert default_capacity("tiny-llama", cores=2, available_bytes=64 * GIB)[0] == 2
    assert job_capacity(5, "llama-1b") == (5, None)  # an operator's count alone
    assert job_capacity(0, "llama-1b")[1] is not None

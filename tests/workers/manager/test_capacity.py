"""The default jobs at once: a count by the cores, and a memory budget they share; a job counted
at its most for the model's shape, less when it recomputes its layers, more with LoRA dropout."""

from __future__ import annotations

import json

from catalogue.builtin import BUILTINS
from workers.manager.capacity import (
    TRAINER_PROCESS_BYTES,
    JobBudget,
    Shape,
    adapts_head,
    default_capacity,
    job_bytes,
    job_capacity,
    layer_values,
    model_shape,
)

GIB = 2**30


def test_a_jobs_most_is_its_process_a_micro_batchs_activations_and_its_logits() -> None:
    llama_1b = model_shape("llama-1b")
    assert llama_1b == Shape(2048, 22, BUILTINS["llama-1b"].config["vocab_size"], 5632,
                             "lm_head")
    # a layer keeps 2 norm inputs, q, k, v, attention's output and o_proj's input (7 tensors of
    # tokens x hidden at most) and the MLP's gate and up outputs (2 of tokens x 5632), in fp32:
    # (7 + 2 x 5632 / 2048) x 2 = 25 of the paper's 16-bit values a token and hidden unit
    assert layer_values(llama_1b) == 25
    activations = 4096 * 25 * 2048 * 22 * 2
    logits = 3 * 4096 * llama_1b.vocab * 4
    assert job_bytes(llama_1b) == TRAINER_PROCESS_BYTES + activations + logits
    assert 11 * GIB < job_bytes(llama_1b) < 12 * GIB  # the 1B model's micro-batch dominates


def test_lora_dropout_keeps_each_adapted_layers_dropped_input_and_its_mask() -> None:
    llama_1b = model_shape("llama-1b")
    # q, k, v, o, gate, up take hidden-wide inputs, down an intermediate-wide one: each kept
    # dropped (fp32: 2 values) with its mask (1 byte: 0.5)
    assert layer_values(llama_1b, dropout=True) - layer_values(llama_1b) == 2.5 * (6 + 2.75)
    assert job_bytes(llama_1b, dropout=True) > job_bytes(llama_1b)


def test_the_shape_is_read_from_a_config_or_the_catalogue(tmp_path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"n_embd": 768, "n_layer": 12,
                                                      "vocab_size": 50257}))
    assert model_shape(str(tmp_path)) == Shape(768, 12, 50257, 4 * 768)  # no model_type: no head
    assert model_shape("tiny-gpt2") == Shape(64, 2, BUILTINS["tiny-gpt2"].config["vocab_size"],
                                             4 * 64, "lm_head")
    assert model_shape(str(tmp_path / "missing")) is None


def test_recomputing_layers_keeps_each_layers_input_and_one_layers_activations() -> None:
    llama_1b = model_shape("llama-1b")
    value = 4096 * 2048 * 2  # a token's hidden unit over the micro-batch, as the paper counts
    assert job_bytes(llama_1b) - job_bytes(llama_1b, recompute=True) == \
        (25 * 22 - (25 + 2 * 22)) * value
    assert job_bytes(llama_1b, recompute=True) < 0.6 * job_bytes(llama_1b)


def test_the_cores_count_the_jobs_and_half_the_memory_is_their_budget() -> None:
    each = job_bytes(model_shape("llama-1b"))
    count, budget = default_capacity("llama-1b", cores=16, available_bytes=6 * each)
    assert count == 8 and budget == JobBudget(3 * each, model_shape("llama-1b"))
    assert budget.cost(False) == each and budget.cost(True) < each < budget.cost(False, True)
    assert default_capacity("no-such-model", cores=6, available_bytes=0) == (3, None)
    assert default_capacity("tiny-llama", cores=2, available_bytes=64 * GIB)[0] == 2
    assert job_capacity(5, "llama-1b") == (5, None)  # an operator's count alone
    assert job_capacity(0, "llama-1b")[1] is not None


def test_with_the_executors_head_loss_a_step_keeps_its_answer_not_the_logits() -> None:
    llama_1b = model_shape("llama-1b")
    logits = 3 * 4096 * llama_1b.vocab * 4
    answer = 4096 * (2048 + 3) * 4  # a loss, a right answer and the hidden state's gradient
    assert job_bytes(llama_1b) - job_bytes(llama_1b, head_loss=True) == logits - answer
    assert job_bytes(llama_1b, recompute=True) - job_bytes(llama_1b, recompute=True,
                                                           head_loss=True) == logits - answer


def test_a_jobs_cost_counts_the_head_loss_only_while_offered_and_the_head_not_adapted() -> None:
    shape = model_shape("llama-1b")
    offered = [False]
    budget = JobBudget(1, shape, lambda: offered[0])
    lora = {"method": "lora", "target_modules": None, "gradient_checkpointing": True}
    on_head = {**lora, "target_modules": ["q_proj", "lm_head"]}
    assert budget.cost_of(lora) == budget.cost_of(on_head) == job_bytes(shape, recompute=True)
    offered[0] = True
    assert budget.cost_of(lora) == job_bytes(shape, recompute=True, head_loss=True)
    assert budget.cost_of(on_head) == job_bytes(shape, recompute=True)
    assert not adapts_head({"method": "prompt_tuning", "target_modules": None}, "lm_head")
    assert adapts_head({"target_modules": ["lm_head"]}, "lm_head")
    assert not adapts_head({"target_modules": ["all-linear"]}, "lm_head")  # leaves the head out
    headless = JobBudget(1, Shape(64, 2, 256, 256), lambda: True)  # no recipe: no head loss
    assert headless.cost_of(lora) == job_bytes(headless.shape, recompute=True)


def test_the_log_gives_head_loss_figures_only_for_a_model_whose_head_the_executor_can_take(
        tmp_path, caplog) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"n_embd": 768, "n_layer": 12,
                                                      "vocab_size": 50257}))
    caplog.set_level("INFO", logger="workers.jobs")
    for model, named in ((str(tmp_path), False), ("llama-1b", True)):
        caplog.clear()
        budget = default_capacity(model, cores=4, available_bytes=64 * GIB)[1]
        (line,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("max_jobs")]
        assert ("head's loss" in line) is named
        if named:
            assert f"{budget.cost(False, head_loss=True) / GIB:.2f} and " in line

"""Quality gates on a real (tiny) PEFT model: the loss gate compares windows of steps, so one
noisy batch decides nothing; it is checked only when asked for; non-finite losses always fail."""

from __future__ import annotations

import math

import pytest
from peft import LoraConfig, TaskType, get_peft_model
from transformers import AutoModelForCausalLM, AutoTokenizer

from catalogue.resolve import resolve_model
from workers.training.gates import check


@pytest.fixture(scope="module")
def model_and_tokenizer():
    path = resolve_model("tiny-llama")
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(path),
                           LoraConfig(task_type=TaskType.CAUSAL_LM, r=2))
    return model, AutoTokenizer.from_pretrained(path)


def verdict(model_and_tokenizer, losses: list[float], gates: dict | None) -> dict:
    model, tokenizer = model_and_tokenizer
    history = [{"step": i + 1, "train_loss": x} for i, x in enumerate(losses)]
    return check(model, tokenizer, history, [], 0, 512, gates)


def test_by_default_a_noisy_last_batch_does_not_fail_a_job(model_and_tokenizer) -> None:
    result = verdict(model_and_tokenizer, [2.1, 2.4], None)
    assert result["passed"] is True
    assert [c["name"] for c in result["checks"]] == ["finite_losses"]


def test_the_loss_gate_compares_the_first_and_last_quarters(model_and_tokenizer) -> None:
    # 8 steps, windows of 2: first mean 4.0, last mean 2.5; the last step alone rose
    losses = [4.5, 3.5, 3.2, 3.0, 2.9, 2.8, 2.0, 3.0]
    passed = verdict(model_and_tokenizer, losses, {"min_loss_drop": 0.3})
    assert passed["passed"] is True and passed["checks"][1]["name"] == "training_loss_fell"
    assert "4.0000" in passed["checks"][1]["detail"] and "2.5000" in passed["checks"][1]["detail"]
    failed = verdict(model_and_tokenizer, losses, {"min_loss_drop": 0.4})
    assert failed["passed"] is False
    assert [c["name"] for c in failed["checks"] if not c["passed"]] == ["training_loss_fell"]


def test_a_non_finite_loss_always_fails(model_and_tokenizer) -> None:
    result = verdict(model_and_tokenizer, [2.0, math.nan], None)
    assert result["passed"] is False and result["checks"][0]["passed"] is False

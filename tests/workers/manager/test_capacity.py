"""The default number of jobs at once: the cores or the memory, whichever allows fewer; a job
counted at its most for the model's shape."""

from __future__ import annotations

import json

from catalogue.builtin import BUILTINS
from workers.manager.capacity import (
    TRAINER_PROCESS_BYTES,
    Shape,
    default_max_jobs,
    job_bytes,
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


def test_the_cores_or_the_memory_whichever_allows_fewer() -> None:
    each = job_bytes(model_shape("llama-1b"))
    assert default_max_jobs("llama-1b", cores=16, available_bytes=100 * each) == 8  # cores
    assert default_max_jobs("llama-1b", cores=16, available_bytes=6 * each) == 3  # memory
    assert default_max_jobs("llama-1b", cores=64, available_bytes=each) == 1  # at least one
    assert default_max_jobs("no-such-model", cores=6, available_bytes=0) == 3  # shape unknown
    assert default_max_jobs("tiny-llama", cores=2, available_bytes=64 * GIB) == 2

"""Split execution equals plain transformers + peft: 6 architectures x 5 PEFT methods, against a
real executor process over ipc (shared memory), and over socket frames."""

from __future__ import annotations

import pytest

from tests.conftest import TINY_MODELS
from tests.peft_reference import METHODS, TOLERANCE, compare
from workers.remote.client import ExecutorClient


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("model", TINY_MODELS)
def test_matches_plain_peft(model: str, method: str, executor_for) -> None:
    client = ExecutorClient(executor_for(model).endpoint, name=f"{model}-{method}")
    try:
        result = compare(model, method, client)
    finally:
        client.close()
    assert result["logits"] <= TOLERANCE, result
    assert result["grads"] <= TOLERANCE, result
    assert result["params"] <= TOLERANCE, result
    assert result["generate_equal"], result
    assert client.calls > 0


@pytest.mark.parametrize("model", ["tiny-llama", "tiny-gpt2"])
def test_socket_frames_match_too(model: str, executor_for) -> None:
    client = ExecutorClient(executor_for(model).endpoint, name="frames", use_shm=False)
    try:
        result = compare(model, "lora", client)
    finally:
        client.close()
    assert max(result["logits"], result["grads"], result["params"]) <= TOLERANCE, result
    assert result["generate_equal"]

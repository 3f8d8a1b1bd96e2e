"""Split execution equals plain transformers + peft: 6 architectures x 5 PEFT methods, against a
real executor process over ipc (shared memory), and over socket frames."""

from __future__ import annotations

import pytest

from tests.conftest import TINY_MODELS
from tests.peft_reference import METHODS, TOLERANCE, compare
from wire.call.messages import Op
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


@pytest.mark.parametrize("method", [m for m in METHODS if m != "prefix_tuning"])
@pytest.mark.parametrize("model", ["tiny-llama", "tiny-gpt2"])
def test_recomputed_layers_match_plain_peft(model: str, method: str, executor_for) -> None:
    """Gradient checkpointing (the layers' forward run again in the backward, calling the
    executor again) against plain peft without it: the same gradients, and more forward calls
    (a layer that recomputes trains per projection, not through a stretch, whose own forward
    would bypass transformers' checkpointing of the layer's)."""
    forwards = {}
    for recompute in (False, True):
        client = ExecutorClient(executor_for(model).endpoint, name=f"re-{model}-{method}")
        forwards[recompute] = 0
        call = client.call

        def counted(op, layer, x, kind, recompute=recompute, call=call):
            forwards[recompute] += op != Op.BACKWARD
            return call(op, layer, x, kind)

        client.call = counted
        try:
            result = compare(model, method, client, recompute=recompute)
        finally:
            client.close()
        assert max(result["logits"], result["grads"], result["params"]) <= TOLERANCE, result
        assert result["generate_equal"], result
    assert forwards[True] > forwards[False], forwards

"""How a call's tensors travel: the choice by where each end is, the fallback when the executor
refuses a device buffer, and (on a GPU) exactness through device buffers over CUDA IPC, a CPU
client's shared memory pinned, and a killed client's buffer freed."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
import torch
from transformers import AutoModelForCausalLM

from catalogue.resolve import resolve_model
from tests.peft_reference import TOLERANCE, compare
from wire.call import messages as P
from wire.call.messages import CallKind, LayerKind, Op
from workers.remote.client import ExecutorClient
from workers.remote.transport import Transport, choose

MODEL = "tiny-llama"


def test_the_transport_follows_where_each_end_is() -> None:
    assert choose("cuda:0", "cuda:0", True, True) == Transport.DEVICE
    assert choose("cuda:1", "cuda", True, True) == Transport.DEVICE  # peer GPU, same host
    assert choose("cuda:0", "cpu", True, True) == Transport.SHARED_MEMORY
    assert choose("cpu", "cuda:0", True, True) == Transport.SHARED_MEMORY
    assert choose("cuda:0", "cuda:0", True, False) == Transport.SHARED_MEMORY  # no doorbell
    assert choose("cuda:0", "cuda:0", False, False) == Transport.FRAMES  # another host


def test_cpu_clients_use_shared_memory_or_frames(executor_for) -> None:
    endpoint = executor_for(MODEL).endpoint
    for options, expected in (({}, Transport.SHARED_MEMORY),
                              ({"use_doorbell": False}, Transport.SHARED_MEMORY),
                              ({"use_shm": False}, Transport.FRAMES)):
        client = ExecutorClient(endpoint, name="transport", **options)
        try:
            assert client.transport == expected, options
        finally:
            client.close()


def test_a_forged_device_buffer_is_refused_and_calls_go_on(executor_for) -> None:
    client = ExecutorClient(executor_for(MODEL).endpoint, name="forger")
    try:
        spec = next(s for s in client.layers if s.kind == LayerKind.LINEAR)
        weight = AutoModelForCausalLM.from_pretrained(resolve_model(MODEL)) \
            .get_submodule(spec.name).weight.detach()
        x = torch.randn(3, spec.in_features, generator=torch.Generator().manual_seed(0))
        forged = P.ShareDevice("GPU-forged", b"\x07" * 64, 1 << 20, 0, b"", False, b"\x00" * 16)
        assert client._channel.request(forged, P.Mapped, 10).ok is False
        y = client.call(Op.FORWARD, spec.index, x, CallKind.INFERENCE)
        assert torch.allclose(y, x @ weight.t(), atol=1e-5)
    finally:
        client.close()


def test_a_refused_control_message_is_reported_at_once(executor_for) -> None:
    """The executor's error for a message it would not take ends the wait (it used to be
    ignored, and the client gave up only at its timeout)."""
    import zmq

    from workers.remote.channel import Channel
    from workers.remote.handle import ExecutorError

    context = zmq.Context()
    channel = Channel(context, executor_for(MODEL).endpoint, "stranger", 2.0, None)
    try:
        share = P.ShareDevice("GPU-x", b"\x07" * 64, 1 << 20, 0, b"", False, b"\x00" * 16)
        started = time.monotonic()
        with pytest.raises(ExecutorError, match="sharedevice refused: say hello first"):
            channel.request(share, P.Mapped, 30)
        assert time.monotonic() - started < 5
    finally:
        channel.close()
        context.term()


def test_a_client_that_cannot_share_a_device_buffer_goes_on_through_shared_memory(
        executor_for) -> None:
    """The client's side of a device buffer on a CPU: its buffer cannot be exported, the
    executor is told to forget any, and calls stay exact through the shared memory."""
    client = ExecutorClient(executor_for(MODEL).endpoint, name="no-device-buffer")
    try:
        assert client._share_device(1 << 16) is False
        assert client.transport == Transport.SHARED_MEMORY
        spec = next(s for s in client.layers if s.kind == LayerKind.LINEAR)
        weight = AutoModelForCausalLM.from_pretrained(resolve_model(MODEL)) \
            .get_submodule(spec.name).weight.detach()
        x = torch.randn(2, spec.in_features, generator=torch.Generator().manual_seed(1))
        assert torch.allclose(client.call(Op.FORWARD, spec.index, x, CallKind.INFERENCE),
                              x @ weight.t(), atol=1e-5)
    finally:
        client.close()


@pytest.mark.gpu
@pytest.mark.parametrize("model", ["tiny-llama", "tiny-gpt2"])
def test_a_gpu_client_through_its_device_buffer_matches_plain_peft(model: str,
                                                                   executor_for) -> None:
    client = ExecutorClient(executor_for(model, device="cuda").endpoint, name="gpu",
                            device="cuda")
    try:
        assert client.transport == Transport.DEVICE
        result = compare(model, "lora", client, device="cuda")
    finally:
        client.close()
    assert max(result["logits"], result["grads"], result["params"]) <= TOLERANCE, result
    assert result["generate_equal"], result


@pytest.mark.gpu
def test_a_cpu_client_of_a_gpu_executor_has_its_shared_memory_pinned_and_matches_plain_peft(
        executor_for) -> None:
    executor = executor_for(MODEL, device="cuda")
    client = ExecutorClient(executor.endpoint, name="pinned-cpu")
    try:
        assert client.transport == Transport.SHARED_MEMORY
        result = compare(MODEL, "lora", client)
    finally:
        client.close()
    assert max(result["logits"], result["grads"], result["params"]) <= TOLERANCE, result
    assert result["generate_equal"], result
    joined = [line for line in executor.log if "client pinned-cpu" in line and "joined" in line]
    assert joined and "shared memory: pinned" in joined[-1], executor.log[-5:]
    assert executor.alive()


@pytest.mark.gpu
def test_a_gpu_client_killed_mid_call_leaves_the_executor_serving_and_frees_its_buffer(
        executor_for, tmp_path) -> None:
    executor = executor_for(MODEL, device="cuda")
    free_before = torch.cuda.mem_get_info()[0]
    flood = subprocess.Popen([sys.executable, "-m", "tests.workers.remote.client_process",
                              "--endpoint", executor.endpoint, "--model", MODEL,
                              "--workload", "flood", "--device", "cuda",
                              "--stop-file", str(tmp_path / "never")])
    time.sleep(8)  # it has grown its buffer and is calling
    flood.kill()
    flood.wait()
    deadline = time.monotonic() + 30
    while torch.cuda.mem_get_info()[0] < free_before - (64 << 20):
        assert time.monotonic() < deadline, "the killed client's device memory stayed in use"
        time.sleep(0.5)
    out = subprocess.run([sys.executable, "-m", "tests.workers.remote.client_process",
                          "--endpoint", executor.endpoint, "--model", MODEL, "--device", "cuda"],
                         capture_output=True, text=True, timeout=300, check=True)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["generate_equal"] and result["logits"] <= TOLERANCE, result
    assert executor.alive()


def test_a_fused_groups_outputs_are_its_own_not_views_of_the_call_memory(executor_for) -> None:
    """Copied straight out of the shared memory, the next call through it leaves them as
    they were (and equal to the layers' own products)."""
    from workers.remote.build import remote_model

    client = ExecutorClient(executor_for(MODEL).endpoint, name="fused-outputs")
    try:
        model = remote_model(MODEL, client)
        group = model.model.layers[0].self_attn.q_proj.fusion
        assert group is not None and client.transport == Transport.SHARED_MEMORY
        plain = AutoModelForCausalLM.from_pretrained(resolve_model(MODEL)).model.layers[0]
        weights = [plain.self_attn.get_submodule(n).weight.detach()
                   for n in ("q_proj", "k_proj", "v_proj")]
        generator = torch.Generator().manual_seed(0)
        for rows in (1, 5):
            first, second = (torch.randn(rows, 64, generator=generator) for _ in range(2))
            outs = group.run(first, CallKind.INFERENCE)
            kept = [o.clone() for o in outs]
            group.run(second, CallKind.INFERENCE)
            for out, copy, weight in zip(outs, kept, weights, strict=True):
                assert torch.equal(out, copy)
                assert torch.allclose(out, first @ weight.t(), atol=1e-5)
    finally:
        client.close()

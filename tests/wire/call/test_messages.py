"""Every wire message survives an encode/decode round trip; nothing is pickled."""

from __future__ import annotations

import msgspec
import pytest
import torch

from wire.call import messages as P
from wire.call.tensors import as_bytes, from_bytes
from wire.figures import ExecutorFigures, LaneFigures

SPEC = P.LayerSpec(3, "model.layers.0.mlp.gate_proj+model.layers.0.mlp.up_proj",
                   P.LayerKind.GROUP, 64, 256, False, ("a", "b"), (128, 128))

TO_EXECUTOR = [
    P.Hello("w", 12, shm_name="symbiosis-1", shm_size=4096, shm_token=b"\x01" * 16),
    P.Remap("symbiosis-2", 8192, b"\x02" * 16),
    P.Call(7, P.Op.BACKWARD, 3, P.CallKind.TRAINING, "bfloat16", (5, 256), 0, 2560),
    P.Call(8, P.Op.FORWARD, 3, P.CallKind.INFERENCE, "float32", (1, 64), 0, 4096, 500, 20_000),
    P.StatsRequest(),
    P.Ping(),
    P.Bye(),
]
FROM_EXECUTOR = [
    P.Welcome("tiny-llama", "float32", [SPEC], True),
    P.Mapped(True),
    P.Result(7, "float32", (5, 64), False),
    P.Error(7, P.ErrorCode.BAD_TENSOR, "wrong shape"),
    P.Stats(ExecutorFigures(1.5, 2, 3, 4, 0, {}, {"decode": LaneFigures(1, 1, 0.1, 0.2, 200.0)})),
    P.Pong("tiny-llama", 3, False),
]


@pytest.mark.parametrize("message", TO_EXECUTOR, ids=lambda m: type(m).__name__)
def test_requests_round_trip(message) -> None:
    data = P.encode(message)
    assert b"\x80" not in data[:1], "pickle protocol marker"
    assert P.decode_request(data) == message


@pytest.mark.parametrize("message", FROM_EXECUTOR, ids=lambda m: type(m).__name__)
def test_replies_round_trip(message) -> None:
    assert P.decode_reply(P.encode(message)) == message


def test_unknown_message_type_is_rejected() -> None:
    with pytest.raises(msgspec.ValidationError):
        P.decode_request(msgspec.msgpack.encode(["launch_missiles", 1]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.int64])
def test_tensor_frames_round_trip(dtype: torch.dtype) -> None:
    t = (torch.randn(3, 5) * 100).to(dtype)
    back = from_bytes(bytes(as_bytes(t)), dtype, (3, 5))
    assert torch.equal(back, t)


def test_truncated_tensor_frame_is_rejected() -> None:
    data = bytes(as_bytes(torch.randn(3, 5)))
    with pytest.raises(ValueError, match="bytes"):
        from_bytes(data[:-4], torch.float32, (3, 5))


def test_a_call_of_several_tenants_carries_the_tightest_target_asked_for_per_lane() -> None:
    assert P.tightest([]) == P.NO_TARGETS
    assert P.tightest([P.NO_TARGETS, P.NO_TARGETS]) == P.NO_TARGETS
    assert P.tightest([P.CallTargets(800, 0), P.NO_TARGETS, P.CallTargets(500, 90_000),
                       P.CallTargets(0, 40_000)]) == P.CallTargets(500, 40_000)
    assert P.tightest([P.CallTargets(0, 30_000)]) == P.CallTargets(0, 30_000)

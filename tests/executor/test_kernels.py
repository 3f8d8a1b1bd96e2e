"""The executor's matmul written into a caller's memory (`kernels.linear_into`): the same
product `linear` returns, by the route each shape takes."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from executor.kernels import INTO_MIN_ROWS, ONEDNN_MIN_WEIGHT, Linear, linear, linear_into


def _weights(out_features: int, in_features: int, dtype=torch.float32):
    generator = torch.Generator().manual_seed(out_features * 7 + in_features)
    weight = torch.randn(out_features, in_features, generator=generator).to(dtype) * 0.05
    bias = torch.randn(out_features, generator=generator).to(dtype)
    return weight, bias


def _into(x, weight, bias=None) -> torch.Tensor:
    out = torch.full((x.shape[0], weight.shape[0]), float("nan"), dtype=x.dtype)
    linear_into(x, weight, bias, out)
    return out


@pytest.mark.parametrize("rows", [1, 3, 37, INTO_MIN_ROWS, 300])
def test_a_backward_into_memory_is_the_very_product_linear_returns(rows: int) -> None:
    """A backward's weight is a transposed view, which `linear` never hands to oneDNN: written
    in place it is MKL's product bit for bit, tiny or not."""
    for out_features, in_features in ((64, 64), (2048, 768)):
        weight, _ = _weights(out_features, in_features)
        grad = torch.randn(rows, out_features)
        expected = linear(grad, weight.t())
        assert torch.equal(_into(grad, weight.t()), expected)
        torch.testing.assert_close(expected, grad @ weight)


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("rows", [1, 8, INTO_MIN_ROWS - 1, INTO_MIN_ROWS, 512])
def test_a_forward_into_memory_equals_the_plain_product(rows: int, bias: bool) -> None:
    """Below `INTO_MIN_ROWS` a weight oneDNN takes keeps oneDNN's result (copied: bit for bit
    `linear`'s); from there on, and for a weight it does not take, MKL writes in place, which is
    F.linear's own product bit for bit."""
    for out_features, in_features in ((64, 64), (1024, 768)):
        weight, b = _weights(out_features, in_features)
        b = b if bias else None
        x = torch.randn(rows, in_features)
        got = _into(x, weight, b)
        torch.testing.assert_close(got, F.linear(x, weight, b))
        onednn = rows < INTO_MIN_ROWS and out_features * in_features >= ONEDNN_MIN_WEIGHT
        assert torch.equal(got, linear(x, weight, b) if onednn else F.linear(x, weight, b))


def test_bfloat16_and_a_recorded_input_are_written_too() -> None:
    weight, bias = _weights(512, 256, torch.bfloat16)
    x = torch.randn(200, 256).to(torch.bfloat16)
    torch.testing.assert_close(_into(x, weight, bias), F.linear(x, weight, bias))
    recorded = torch.randn(130, 256, requires_grad=True)  # autograd's: `linear`'s route, copied
    weight32 = weight.float()
    with torch.no_grad():
        expected = F.linear(recorded, weight32)
    out = torch.empty(130, 512)
    linear_into(recorded, weight32, None, out)
    torch.testing.assert_close(out, expected)


def test_the_runner_returns_and_writes_the_same() -> None:
    weight, bias = _weights(96, 48)
    run = Linear(weight, bias)
    x = torch.randn(5, 48)
    out = torch.empty(5, 96)
    run.into(x, out)
    assert torch.equal(run(x), linear(x, weight, bias))
    torch.testing.assert_close(out, run(x))

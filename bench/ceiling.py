"""The most sharing the base model could buy fine-tuning on this machine.

Sharing one base model can make the base matmuls cheaper (bigger batches, one copy of the
weights) but not the rest of a job: attention, norms, adapters, loss, optimizer, autograd and
Python stay per tenant. `free_base` measures that rest directly: a plain job whose frozen linear
layers cost nothing (zeros of the right shape, forward and backward). The ceiling adds the base
matmuls' FLOPs at the machine's measured matmul peak, as if they ran there with no overhead at
all; no executor can beat it on the same cores.
"""

from __future__ import annotations

import torch
from torch import nn


class _Free(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        ctx.in_shape = x.shape
        return x.new_zeros(*x.shape[:-1], weight.shape[0])

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad.new_zeros(ctx.in_shape), None


def free_base(model: nn.Module) -> int:
    """Make every frozen linear layer cost nothing; how many there were."""
    swapped = 0
    for module in model.modules():
        if isinstance(module, nn.Linear) and not module.weight.requires_grad:
            module.forward = _free_forward(module)
            swapped += 1
    return swapped


def _free_forward(module: nn.Linear):
    return lambda x: _Free.apply(x, module.weight)


def ceiling(free_tokens_per_s: float, flops_per_token: float, peak_gflops: float) -> float:
    """Tokens/s with the rest as measured and the base matmuls at peak, sharing the cores."""
    return 1.0 / (1.0 / free_tokens_per_s + flops_per_token / (peak_gflops * 1e9))

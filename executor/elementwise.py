"""The norms and activations a stretch runs without their module calls (fewer tensor ops, the
same ops in the same order), and their gradients for the kept stretch's backward
(`executor.kept`): by formula for an RMS norm in float32 and a gated SiLU, the llama family's,
where autograd's graph of a few ops costs more than the ops themselves on a few dozen rows
(llama-160m, 32 rows: ~1 ms of a 3 ms backward); by autograd for any other. An RMS norm's
forward and gradient run on one thread up to 2 MB of rows (`copy_threads`): the executor's
other thread sleeps between ops, and waking it costs more than its half of a few hundred rows."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from wire.call.threads import copy_threads

RMS_NORMS = {"LlamaRMSNorm", "Qwen2RMSNorm", "MistralRMSNorm"}  # the same forward, checked


class RMSNorm:
    """A known RMS norm's forward (the module's in float32; the module itself otherwise) and
    its input gradient."""

    __slots__ = ("eps", "module", "weight")

    def __init__(self, module: nn.Module) -> None:
        self.module, self.weight = module, module.weight
        # as a tensor: adding a Python float wraps it first (4.8 against 2.2 us), same sum
        self.eps = torch.tensor(module.variance_epsilon, dtype=torch.float32,
                                device=module.weight.device)

    def __call__(self, h: torch.Tensor) -> torch.Tensor:
        if h.dtype != torch.float32:
            return self.module(h)
        with copy_threads(h):
            return self.weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps))

    def grad(self, h: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
        """y = w h r with r = (mean(h^2) + eps)^-1/2: dL/dh = r (w g) - h r^3 mean(w g h)."""
        with copy_threads(h):
            r = torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
            wg = grad * self.weight
            return (wg - h * (r * r * (wg * h).mean(-1, keepdim=True))).mul_(r)


def norm_function(module: nn.Module) -> Callable[[torch.Tensor], torch.Tensor]:
    """The norm's forward without the module call around it, for the norms whose forward is
    known (the same ops in the same order); any other norm runs as its module."""
    if type(module).__name__ in RMS_NORMS and not module._forward_hooks:
        return RMSNorm(module)
    if type(module) is nn.LayerNorm:
        return lambda h: F.layer_norm(h, module.normalized_shape, module.weight, module.bias,
                                      module.eps)
    return module


def activation_function(module: Callable) -> Callable[[torch.Tensor], torch.Tensor]:
    """F.silu for SiLU modules (their forward is exactly that); any other as itself."""
    if type(module).__name__ in ("SiLUActivation", "SiLU") and not getattr(
            module, "inplace", False):
        return F.silu
    return module


def norm_grad(norm: Callable[[torch.Tensor], torch.Tensor], h: torch.Tensor,
              grad: torch.Tensor) -> torch.Tensor:
    """The gradient at the norm's input `h`, given its output's `grad`."""
    if isinstance(norm, RMSNorm) and h.dtype == torch.float32:
        return norm.grad(h, grad)
    with torch.enable_grad():
        h = h.detach().requires_grad_(True)
        (through,) = torch.autograd.grad(norm(h), h, grad)
    return through


def gated_grad(act: Callable[[torch.Tensor], torch.Tensor], gate: torch.Tensor,
               up: torch.Tensor, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The gradients at a gated MLP's two products, m = act(gate) * up, given m's `grad`."""
    if act is F.silu:
        return torch.ops.aten.silu_backward(grad * up, gate), grad * F.silu(gate)
    with torch.enable_grad():
        gate, up = gate.detach().requires_grad_(True), up.detach().requires_grad_(True)
        return torch.autograd.grad(act(gate) * up, (gate, up), grad)


def act_grad(act: Callable[[torch.Tensor], torch.Tensor], u: torch.Tensor,
             grad: torch.Tensor) -> torch.Tensor:
    """The gradient at an ungated MLP's product u, m = act(u), given m's `grad`."""
    with torch.enable_grad():
        u = u.detach().requires_grad_(True)
        # a module (GPT-2's GELU) takes a view: its backward hooks, where a tracker set them (a
        # flop counter), refuse a leaf under autograd.grad
        (through,) = torch.autograd.grad(act(u.view_as(u)), u, grad)
    return through

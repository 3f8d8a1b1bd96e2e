"""Kept stretches: a decoder layer's stretch for training whose backward computes nothing twice.

A stretch's backward (`executor.stretches.Stretch.backward`) keeps nothing in the executor and
so recomputes the output projection and the MLP's input products, 5.3M of a llama-160m
stretch's 9.4M multiply-adds a row, under autograd. A kept stretch (`<layer>.stretch+kept`,
`LayerKind.KEPT`) hands those back with its result instead: its forward returns [the stretch's
result | h, the residual stream before the MLP | u, the MLP's input products (gate and up, or
the one input product)], the trainer keeps h and u for the backward (as its own MLP would keep
the same products), and the backward takes [the residual output | the output gradients | h | u]
and goes back through the next input norm, the down projection, the activation, the MLP's input
products, the post-attention norm and the output projection, each product once. Still nothing
is kept in the executor between forward and backward. Workers of a GPU executor keep the
recomputing backward (`workers.remote.stretch`; the two not compared there: a GPU's products
are cheap, and these results are 2 x intermediate columns a row more to move).
"""

from __future__ import annotations

import torch

from executor.elementwise import act_grad, gated_grad, norm_grad
from executor.kernels import linear
from executor.stretches import Stretch
from wire.call.messages import LayerKind, LayerSpec
from wire.call.threads import copy_threads


class Kept(Stretch):
    """Forward: [rows, attention width + hidden] -> [the stretch's result | h | u].
    Backward: [rows, hidden (the residual output) + the stretch's result width (its gradients)
    + hidden + u's width] -> [rows, attention width + hidden], the input gradients."""

    def __init__(self, stretch: Stretch) -> None:
        self.__dict__.update(stretch.__dict__)  # the same modules and weights
        self.inner = [m.spec.out_features for m in self.mlp_in]

    def _parts(self, attn: torch.Tensor, residual: torch.Tensor) -> list[torch.Tensor]:
        h = self._attended(attn, residual)
        u = self._inner(h)
        with copy_threads(u[0]):  # as a copy of its size: a second thread's wake-up costs more
            m = self._activated(u)  # (12 llama-160m layers at 32 rows: 93 -> 89 ms, 2-core Xeon)
        return [*self._out(h, m), h, *u]

    def backward(self, x: torch.Tensor) -> torch.Tensor:
        hidden, inner = self.widths[1], sum(self.inner)
        out, grad, h, u = x.split([hidden, x.shape[1] - 2 * hidden - inner, hidden, inner],
                                  dim=1)
        grad_h = self._grad_output(out, grad)
        grad_m = linear(grad_h, self.down.weight.t())  # d = down(m) + h
        # h = o(attention) + residual; not in place: grad_h may be a view of the call's input
        through = norm_grad(self.post_norm, h, self._grad_norm(u, grad_m))
        with copy_threads(through):
            grad_h = grad_h + through
        return torch.cat([linear(grad_h, self.o.weight.t()), grad_h], dim=1)

    def _grad_norm(self, u: torch.Tensor, grad_m: torch.Tensor) -> torch.Tensor:
        """The gradient at the post-attention norm's output n, back through the activation and
        the MLP's input products u = n W^T, given the gradient at the activation's output."""
        if not self.gated:
            return linear(act_grad(self.act, u, grad_m), self.mlp_in[0].weight.t())
        gate, up = u.chunk(2, dim=1)  # u: [gate | up], one fused product or two
        with copy_threads(gate):
            grad_gate, grad_up = gated_grad(self.act, gate, up, grad_m)
        weights = [m.weight for m in self.mlp_in]
        w_gate, w_up = weights if len(weights) == 2 else weights[0].chunk(2, dim=0)
        return torch.addmm(linear(grad_gate, w_gate.t()), grad_up, w_up)


def build(first_index: int, stretches: list[tuple[LayerSpec, object]]
          ) -> list[tuple[LayerSpec, Kept]]:
    """A kept stretch for each decoder layer's stretch (not the one through the head, which no
    training call takes: the head's loss is a call of its own, `executor.loss`)."""
    kept = []
    for spec, stretch in stretches:
        if spec.kind != LayerKind.STRETCH or not spec.name.endswith(".stretch"):
            continue
        layer = Kept(stretch)
        splits = (*spec.splits, spec.splits[0] + sum(layer.inner))
        kept.append((LayerSpec(first_index + len(kept), f"{spec.name}+kept", LayerKind.KEPT,
                               spec.in_features, sum(splits), False, members=spec.members,
                               splits=splits), layer))
    return kept

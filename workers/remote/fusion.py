"""Fused calls: linear layers that share one input (q/k/v, gate/up) travel as one executor call.

The first member called with an input runs the whole group (one matmul in the executor, one
autograd node, so backward is one call as well); its siblings then find their outputs waiting,
matched by the identity and version of the input tensor. If the siblings are not called with that
same input (an adapter that rescales a member's input, say), the prefetch is wasted and after a few
misses the group falls back to one call per layer, so results are always exact.
"""

from __future__ import annotations

import logging

import torch

from wire.call.messages import CallKind, LayerSpec, Op
from wire.call.threads import copy_threads
from workers.remote.layers import RemoteLinear, remote_rows
from workers.remote.parts import Parts

log = logging.getLogger("workers.remote.fusion")
MAX_MISSES = 3


class FusedGroup:
    def __init__(self, spec: LayerSpec, members: list[RemoteLinear]) -> None:
        self.spec = spec
        self.members = members
        self.position = {id(m): i for i, m in enumerate(members)}
        self.enabled = True
        self.misses = 0
        self._input: torch.Tensor | None = None
        self._version = -1
        self._pending: dict[int, torch.Tensor] = {}
        for member in members:
            member.fusion = self

    def output(self, member: RemoteLinear, x: torch.Tensor) -> torch.Tensor:
        i = self.position[id(member)]
        if self._input is x and self._version == x._version and i in self._pending:
            out = self._pending.pop(i)
            if not self._pending:
                self._input = None
            return out
        if self._pending:
            self._miss()
        if torch.is_grad_enabled():
            outs = _RemoteGroupFn.apply(x, self, CallKind.TRAINING)
        else:  # inference: no autograd node to build
            outs = self.run(x, CallKind.INFERENCE)
        self._pending = {j: o for j, o in enumerate(outs) if j != i}
        self._input, self._version = (x, x._version) if self._pending else (None, -1)
        return outs[i]

    def _miss(self) -> None:
        self.misses += 1
        self._pending.clear()
        if self.misses >= MAX_MISSES:
            self.enabled = False
            log.info("group %s: members get different inputs; one call per layer", self.spec.name)


    def run(self, x: torch.Tensor, kind: CallKind) -> tuple[torch.Tensor, ...]:
        """One executor call for the whole group; each member's output in a tensor of its own
        (as autograd wants of a custom Function's outputs), copied straight out of the call's
        memory: one copy of the group's result, not two."""
        y = remote_rows(self.members[0].executor, Op.FORWARD, self.spec.index, x, kind,
                        self.spec.out_features, x.dtype, fresh=False)
        parts = y.split_with_sizes(self.spec.splits, dim=-1)  # Tensor.split: +4 us of Python
        with copy_threads(y):
            return tuple(p.clone(memory_format=torch.contiguous_format) for p in parts)


class _RemoteGroupFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, group: FusedGroup, kind: CallKind):
        ctx.group = group
        ctx.x_dtype = x.dtype
        return group.run(x, kind)

    @staticmethod
    def backward(ctx, *grads: torch.Tensor):
        group: FusedGroup = ctx.group
        first = grads[0]
        parts = Parts([g.reshape(-1, g.shape[-1]) for g in grads])  # joined in the call
        grad_x = remote_rows(group.members[0].executor, Op.BACKWARD, group.spec.index, parts,
                             CallKind.TRAINING, group.spec.in_features, ctx.x_dtype)
        return grad_x.view(*first.shape[:-1], -1), None, None

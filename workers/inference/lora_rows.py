"""LoRA for a batch whose rows go through different adapters, in two matmuls per module.

peft's mixed batches loop over the adapters present: for each, an index of its rows, two small
matmuls and a write back (about eight operations an adapter, a module, a step). Here the
adapters' A matrices lie side by side (R columns: the sum of their ranks), each row's `x @ Aᵀ`
is multiplied by its adapter's scaling on its adapter's columns and by zero on the others, and
one matmul with the B matrices side by side adds every row's delta at once: the segmented
matmul of Punica and S-LoRA, in plain torch. A row's delta equals peft's up to the order of
float additions (the zeros add nothing).

A module qualifies when it is a plain LoRA Linear (not merged, not disabled) and none of the
forward's adapters there uses a variant (aLoRA; peft mixes no DoRA at all), a bias on B or a
dropout in training mode. Any other module keeps peft's mixed path.
"""

from __future__ import annotations

import weakref
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from peft.tuners.lora import Linear as LoraLinear


class Stacked(NamedTuple):
    """One module's adapters of one forward, side by side."""

    a: torch.Tensor  # (R, in)
    b: torch.Tensor  # (out, R)
    layout: tuple[tuple[int, int, float], ...]  # (slot, rank, scaling) per adapter, in order


class RowPlan:
    """One forward's rows: the adapters present in a fixed order, each row's slot among them
    (-1: the base model), and the per-row factor of each column layout met so far."""

    def __init__(self, names: list[str], base: str) -> None:
        self.names = names
        self.order = sorted(set(names) - {base})
        slot = {name: k for k, name in enumerate(self.order)}
        self.slots = [slot.get(name, -1) for name in names]
        self._factors: dict[tuple, torch.Tensor] = {}

    def factor(self, stacked: Stacked) -> torch.Tensor:
        """(rows, R): a row's adapter's scaling on that adapter's columns, zero elsewhere."""
        key = (stacked.layout, stacked.a.dtype, stacked.a.device)
        factor = self._factors.get(key)
        if factor is None:
            columns = [(slot, s) for slot, rank, s in stacked.layout for _ in range(rank)]
            factor = torch.tensor([[s if slot == row else 0.0 for slot, s in columns]
                                   for row in self.slots], dtype=stacked.a.dtype)
            factor = self._factors[key] = factor.to(stacked.a.device)
        return factor


class Stacks:
    """Each qualifying module's stacked adapters for the last set it served (kept while that set
    stays: a decode step after step over the same rows copies nothing)."""

    def __init__(self) -> None:
        self._cache: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def clear(self) -> None:
        self._cache = weakref.WeakKeyDictionary()

    def __len__(self) -> int:
        """How many modules hold a stack (the modules the two-matmul path served)."""
        return len(self._cache)

    def of(self, module: Any, plan: RowPlan) -> Stacked | None:
        """`module`'s adapters of `plan` side by side; None when it does not qualify."""
        if type(module) is not LoraLinear or module.merged or module.disable_adapters:
            return None
        present = [(slot, name) for slot, name in enumerate(plan.order) if name in module.lora_A]
        parts = []
        for slot, name in present:
            a, b = module.lora_A[name], module.lora_B[name]
            dropout = module.lora_dropout[name]
            if name in module.lora_variant or b.bias is not None or \
                    (dropout.training and getattr(dropout, "p", 0) > 0):
                return None
            parts.append((slot, a.weight, b.weight, float(module.scaling[name])))
        key = tuple((slot, id(a), a._version, id(b), b._version, s) for slot, a, b, s in parts)
        cached = self._cache.get(module)
        if cached is not None and cached[0] == key:
            return cached[1]
        stacked = Stacked(
            torch.cat([a for _, a, _, _ in parts]) if parts else None,
            torch.cat([b for _, _, b, _ in parts], dim=1) if parts else None,
            tuple((slot, a.shape[0], s) for slot, a, _, s in parts))
        # the weights stay referenced with their ids: an id is never reused while cached
        self._cache[module] = (key, stacked, parts)
        return stacked


def forward_rows(module: Any, x: torch.Tensor, stacked: Stacked, plan: RowPlan,
                 *args: Any, **kwargs: Any) -> torch.Tensor:
    """The base layer's output plus each row's own adapter's delta (rows: dim 0 of `x`)."""
    result = module.base_layer(x, *args, **kwargs)
    if not stacked.layout:
        return result
    factor = plan.factor(stacked)
    h = F.linear(x.to(stacked.a.dtype), stacked.a)
    h = h * factor.view(factor.shape[0], *([1] * (h.dim() - 2)), factor.shape[1])
    return result + F.linear(h, stacked.b).to(result.dtype)

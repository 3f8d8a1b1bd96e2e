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
    """One module's adapters of one set, side by side."""

    a: torch.Tensor | None  # (R, in); None: no adapter of the set is in this module
    b: torch.Tensor | None  # (out, R)
    layout: tuple[tuple[int, int, float], ...]  # (slot, rank, scaling) per adapter, in order
    order: tuple[str, ...]  # the set: the forward's adapters
    weights: tuple[torch.Tensor, ...]  # what was stacked, and the versions it had then
    versions: tuple[int, ...]

    def holds(self, order: tuple[str, ...]) -> bool:
        """Whether this stack is of `order` and no tensor of it changed in place since."""
        return self.order == order and \
            all(w._version == v for w, v in zip(self.weights, self.versions, strict=True))


class RowPlan:
    """One forward's rows: the adapters present in a fixed order and each row's slot among them
    (-1: the base model); `by_position`: the rows are the positions of one sequence."""

    def __init__(self, names: list[str], base: str, by_position: bool = False) -> None:
        self.names = names
        self.dim = 1 if by_position else 0  # of a module's input: the rows
        self.factors: dict[tuple, torch.Tensor] = {}  # by position: this forward's (`Stacks`)
        self.order = tuple(sorted(set(names) - {base}))
        slot = {name: k for k, name in enumerate(self.order)}
        self.slots = tuple(slot.get(name, -1) for name in names)
        self._gather: dict[torch.device, torch.Tensor] = {}

    def gather(self, device: torch.device) -> torch.Tensor:
        """Each row's slot as an index on `device`, a base-model row's one past the adapters'
        (made once a forward, for every module that gathers by row)."""
        index = self._gather.get(device)
        if index is None:
            none = len(self.order)
            index = self._gather[device] = torch.tensor(
                [none if slot < 0 else slot for slot in self.slots], device=device)
        return index


class Stacks:
    """Each qualifying module's stack for the last set of adapters it served (kept while that
    set stays: decode steps over the same rows copy nothing), and the per-row factors."""

    FACTORS = 256  # factors kept (one per rows and column layout met); then started afresh

    def __init__(self) -> None:
        self._stacks: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._factors: dict[tuple, torch.Tensor] = {}

    def clear(self) -> None:
        self._stacks = weakref.WeakKeyDictionary()
        self._factors = {}

    def __len__(self) -> int:
        """How many modules hold a stack (the modules the two-matmul path served)."""
        return len(self._stacks)

    def of(self, module: Any, plan: RowPlan) -> Stacked | None:
        """`module`'s adapters of `plan` side by side; None when it does not qualify."""
        if type(module) is not LoraLinear or module.merged or module.disable_adapters:
            return None
        stacked = self._stacks.get(module)
        if stacked is None or not stacked.holds(plan.order):
            stacked = _stack(module, plan.order)
            if stacked is not None:
                self._stacks[module] = stacked
        return stacked

    def factor(self, stacked: Stacked, plan: RowPlan) -> torch.Tensor:
        """(rows, R): a row's adapter's scaling on that adapter's columns, zero elsewhere."""
        key = (plan.slots, stacked.layout, stacked.a.dtype, stacked.a.device)
        # a packed step's positions are met once: its factors are kept for its forward only
        factors = plan.factors if plan.dim else self._factors
        factor = factors.get(key)
        if factor is None:
            if factors is self._factors and len(factors) >= self.FACTORS:
                self._factors = factors = {}
            slots = torch.tensor([slot for slot, rank, _ in stacked.layout for _ in range(rank)])
            scales = torch.tensor([s for _, rank, s in stacked.layout for _ in range(rank)],
                                  dtype=stacked.a.dtype)
            factor = (torch.tensor(plan.slots)[:, None] == slots[None, :]) * scales
            factor = factors[key] = factor.to(stacked.a.device)
        return factor


def _stack(module: Any, order: tuple[str, ...]) -> Stacked | None:
    parts = []
    for slot, name in enumerate(order):
        if name not in module.lora_A:
            continue
        a, b, dropout = module.lora_A[name], module.lora_B[name], module.lora_dropout[name]
        if name in module.lora_variant or b.bias is not None or \
                (dropout.training and getattr(dropout, "p", 0) > 0):
            return None
        parts.append((slot, a.weight, b.weight, float(module.scaling[name])))
    weights = tuple(w for _, a, b, _ in parts for w in (a, b))
    return Stacked(
        torch.cat([a for _, a, _, _ in parts]) if parts else None,
        torch.cat([b for _, _, b, _ in parts], dim=1) if parts else None,
        tuple((slot, a.shape[0], s) for slot, a, _, s in parts), order,
        weights, tuple(w._version for w in weights))


def forward_rows(module: Any, x: torch.Tensor, stacked: Stacked, factor: torch.Tensor | None,
                 *args: Any, rows_dim: int = 0, **kwargs: Any) -> torch.Tensor:
    """The base layer's output plus each row's own adapter's delta (rows: `rows_dim` of `x`)."""
    result = module.base_layer(x, *args, **kwargs)
    if factor is None:
        return result
    h = F.linear(x.to(stacked.a.dtype), stacked.a)
    return result + F.linear(h * along(factor, h, rows_dim), stacked.b).to(result.dtype)


def along(per_row: torch.Tensor, like: torch.Tensor, dim: int) -> torch.Tensor:
    """`per_row` (rows, width) viewed to broadcast over `like`, whose rows lie along `dim`."""
    shape = [1] * like.dim()
    shape[dim], shape[-1] = per_row.shape
    return per_row.view(shape)

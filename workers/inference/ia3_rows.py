"""IA3 for a batch whose rows go through different adapters: each row scaled by its own
adapter's vector.

peft's IA3 layer scales every row by the product of its active adapters' vectors, so a PeftModel
of several IA3 adapters serves one adapter a forward. Here each row's vector is gathered from
the forward's adapters' vectors (ones for a row of another group's adapter or of an adapter
that does not touch this module) and multiplies the module's input (feed-forward) or output, as
peft does for one adapter: the same operations in the same dtypes, so a row equals peft's with
its adapter alone, bit for bit.
"""

from __future__ import annotations

from typing import Any

import torch
from peft.tuners.ia3 import Linear as IA3Linear

from workers.inference.lora_rows import RowPlan, along


def qualifies(module: Any) -> bool:
    return type(module) is IA3Linear and not module.merged and not module.disable_adapters


def scales(module: Any, plan: RowPlan, device: torch.device) -> torch.Tensor:
    """(rows, features): each row's adapter's vector in this module (ones: none there)."""
    vectors = {name: module.ia3_l[name].flatten() for name in plan.order
               if name in module.ia3_l}
    if not vectors:
        features = module.in_features if module.is_feedforward else module.out_features
        return torch.ones(len(plan.slots), features, device=device)
    one = torch.ones_like(next(iter(vectors.values())))
    table = torch.stack([vectors.get(name, one) for name in plan.order] + [one])
    return table[plan.gather(table.device)]


def forward_rows(module: Any, x: torch.Tensor, plan: RowPlan, *args: Any,
                 **kwargs: Any) -> torch.Tensor:
    """The base layer over rows (dim `plan.dim` of `x`) each scaled by its own adapter's
    vector."""
    scale = along(scales(module, plan, x.device), x, plan.dim)
    previous_dtype = x.dtype
    if module.is_feedforward:
        return module.base_layer((x.to(scale.dtype) * scale).to(previous_dtype), *args, **kwargs)
    result = module.base_layer(x, *args, **kwargs)
    return (result * scale).to(result.dtype)

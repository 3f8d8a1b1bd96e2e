"""What a worker keeps resident at most, and what its adapters hold against that."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

import torch


@dataclass(frozen=True)
class Budget:
    """Resident adapters at most: their number, their memory, one tenant's share of that memory
    (bytes: 0 for no bound)."""

    count: int = 32
    bytes: int = 0  # an adapter's tensors; an adapter with an engine of its own: its model's too
    tenant_bytes: int = 0


class Held(Protocol):
    tenant: str
    bytes: int


class Holding:
    """What some adapters hold against a budget: how many, their bytes, each tenant's bytes."""

    def __init__(self, budget: Budget, adapters: Iterable[Held] = ()) -> None:
        self.budget = budget
        self.count = self.bytes = 0
        self.by_tenant: Counter[str] = Counter()
        for adapter in adapters:
            self.add(adapter)

    def add(self, adapter: Held) -> None:
        self.count += 1
        self.bytes += adapter.bytes
        self.by_tenant[adapter.tenant] += adapter.bytes

    def remove(self, adapter: Held) -> None:
        self.count -= 1
        self.bytes -= adapter.bytes
        self.by_tenant[adapter.tenant] -= adapter.bytes

    def past(self, tenant: str | None = None) -> bool:
        """Past the budget, or past `tenant`'s share (None: any tenant's)."""
        return self._worker_past() or self._share_past(tenant)

    def past_tenant_only(self, tenant: str) -> bool:
        """Past `tenant`'s share while within the worker's budget: only the tenant's own
        adapters can make room."""
        return not self._worker_past() and self._share_past(tenant)

    def _worker_past(self) -> bool:
        budget = self.budget
        return self.count > budget.count or (budget.bytes > 0 and self.bytes > budget.bytes)

    def _share_past(self, tenant: str | None) -> bool:
        limit = self.budget.tenant_bytes
        if not limit:
            return False
        shares = self.by_tenant.values() if tenant is None else [self.by_tenant[tenant]]
        return any(held > limit for held in shares)


def tensor_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """The memory behind `tensors`, each storage once (a base weight's stub: one element)."""
    storages = {}
    for tensor in tensors:
        storage = tensor.untyped_storage()
        storages[storage.data_ptr()] = storage.nbytes()
    return sum(storages.values())

"""An in-process stand-in for the executor: the same handle, no sockets. For fast unit tests."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch

from catalogue.resolve import resolve_model
from executor.registry import LayerRegistry
from wire.call.messages import CallKind, LayerSpec, Op

Tap = Callable[[Op, LayerSpec, torch.Tensor], None]


class LocalExecutor:
    def __init__(self, registry: LayerRegistry, tap: Tap | None = None) -> None:
        self.registry = registry
        self.model = registry.model_name
        self.dtype = registry.dtype
        self.layers: list[LayerSpec] = registry.specs
        self.device = "cpu"
        self.tap = tap
        self.calls = 0

    @classmethod
    def load(cls, model: str | Path, *, dtype: torch.dtype = torch.float32, fuse: bool = True,
             tap: Tap | None = None) -> LocalExecutor:
        return cls(LayerRegistry.load(resolve_model(model), dtype=dtype, fuse=fuse), tap)

    def call(self, op: Op, layer: int, x: torch.Tensor, kind: CallKind) -> torch.Tensor:
        self.calls += 1
        base = self.registry.get(layer)
        if self.tap is not None:
            self.tap(op, base.spec, x.detach().clone())
        if x.is_floating_point():
            x = x.to(self.dtype)
        return self.registry.run(op, base, x)

    def close(self) -> None:
        """Nothing to let go of: the layers live in this process."""

"""Privacy mode (paper 3.8): the executor never receives a raw activation or a raw gradient.

Base layers are linear, so a client can add noise n to its input and subtract the noise's effect:
    forward:  (x + n) W^T + b - n W^T = x W^T + b
    backward: (g + m) W       - m W   = g W
Each row gets its own noise, a random combination of a per-layer pool of orthonormal noise
directions: as many as the layer is wide, up to `pool_size` (256), so the noise spans the whole
space of a layer up to 256 wide and 256 dimensions of a wider one; an executor that removes the
principal components of what it receives removes signal with the noise (the attack test,
tests/workers/remote/test_privacy_attack.py). The pool's effects are computed once per layer,
either from the public checkpoint on the client ("local", default: the executor never sees the
pool) or through the executor's bias-free path ("executor", as in the paper: the executor sees the
pool once). Exact in float32 up to rounding (error grows with the noise scale).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from wire.executor import CallKind, LayerKind, Op
from workers.remote.handle import ExecutorHandle

WeightSource = Callable[[str], torch.Tensor]  # layer name -> its weight as [out, in]


@dataclass(frozen=True)
class PrivacyConfig:
    pool_size: int = 256  # noise directions per layer: min(layer width, pool_size)
    scale: float = 1.0  # noise norm relative to each row's own norm (error grows with it)
    noise_effects: str = "local"  # local | executor
    seed: int | None = None
    backward: bool = False  # also build the backward pools up front (trainers)

    def __post_init__(self) -> None:
        if self.noise_effects not in ("local", "executor"):
            raise ValueError("noise_effects must be 'local' or 'executor'")
        if self.pool_size < 1 or self.scale <= 0:
            raise ValueError("pool_size must be >= 1 and scale > 0")


class PrivateExecutor:
    """Wraps an executor handle, masking every floating point input it sends."""

    def __init__(self, inner: ExecutorHandle, config: PrivacyConfig,
                 weights: WeightSource | None = None) -> None:
        if config.noise_effects == "local" and weights is None:
            raise ValueError("local noise effects need the checkpoint's weights")
        self.inner = inner
        self.config = config
        self.weights = weights
        self.model, self.dtype, self.layers = inner.model, inner.dtype, inner.layers
        self.device = getattr(inner, "device", "cpu")
        self._rng = torch.Generator()
        if config.seed is None:
            self._rng.seed()  # from the OS's entropy, not torch's global seed
        else:
            self._rng.manual_seed(config.seed)
        self._pools: dict[tuple[int, Op], tuple[torch.Tensor, torch.Tensor]] = {}
        self._placed: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}  # copies on a GPU

    def call(self, op: Op, layer: int, x: torch.Tensor, kind: CallKind) -> torch.Tensor:
        if not x.is_floating_point():
            raise PermissionError("privacy mode never sends token ids: embeddings stay local")
        pool, effect = self._pool(layer, op, x.device)
        x = x.to(torch.float32)
        norms = x.norm(dim=1, keepdim=True).clamp_min(1e-3)
        coeffs = torch.randn(x.shape[0], pool.shape[0], generator=self._rng).to(x.device)
        coeffs = coeffs * (self.config.scale * norms / pool.shape[0] ** 0.5)
        masked = self.inner.call(op, layer, x + coeffs @ pool, kind)
        return masked.to(x.device, torch.float32) - coeffs @ effect

    def warm(self, layers: list[int]) -> None:
        """Build the pools and their effects of `layers` now (at model build), not at their
        first call: a wide layer's effects cost a matmul of the pool through its weight."""
        for layer in layers:
            self._pool(layer, Op.FORWARD)
            if self.config.backward:
                self._pool(layer, Op.BACKWARD)

    def _pool(self, layer: int, op: Op,
              device: torch.device | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """The layer's noise directions and their effect through its weight (on `device`)."""
        key = (layer, Op.BACKWARD if op == Op.BACKWARD else Op.FORWARD)
        if device is not None and device.type != "cpu":
            placed = self._placed.get((key, device))
            if placed is None:
                placed = self._placed[(key, device)] = tuple(t.to(device) for t in
                                                             self._pool(layer, op))
            return placed
        if key not in self._pools:
            spec = self.layers[layer]
            width = spec.out_features if op == Op.BACKWARD else spec.in_features
            size = min(width, self.config.pool_size)
            basis = torch.randn(width, size, generator=self._rng, dtype=torch.float64)
            pool = torch.linalg.qr(basis).Q.t().to(torch.float32)  # orthonormal rows
            self._pools[key] = (pool, self._effect(layer, key[1], pool))
        return self._pools[key]

    def _effect(self, layer: int, op: Op, pool: torch.Tensor) -> torch.Tensor:
        spec = self.layers[layer]
        if self.config.noise_effects == "executor":
            inner_op = Op.BACKWARD if op == Op.BACKWARD else Op.FORWARD_NOBIAS
            return self.inner.call(inner_op, layer, pool, CallKind.INFERENCE).to(torch.float32)
        names = spec.members if spec.kind == LayerKind.GROUP else (spec.name,)
        weight = torch.cat([self.weights(name).to(torch.float32) for name in names])
        return pool @ weight if op == Op.BACKWARD else pool @ weight.t()

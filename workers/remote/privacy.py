"""Privacy mode: the executor never receives a raw activation or a raw gradient.

Threat model: an honest-but-curious executor that knows the public base weights and records every
call (README, "Privacy mode"). Base layers are linear, so a tenant adds noise n to a row and
subtracts the noise's effect:
    forward:  (x + n) W^T + b - n W^T = x W^T + b
    backward: (g + m) W       - m W   = g W
The noise is a one-time pad: fresh Gaussian rows spanning the layer's whole width, each used
once, `noise` times the call's largest row norm per coordinate (so its energy is at least
`noise^2 * width` times the signal's), their effects computed in the tenant from the mapped public
checkpoint. The executor never sees a pad. Pads are prepared `pad_rows` at a time, so decode
pays one small matmul per layer every `pad_rows` tokens; a training call one as large as its own.
What leaks stays local (`local_modules`): the embeddings, the first `local_layers` decoder layers
(whose inputs come from a finite public dictionary) and, in trainers, the output head (whose
gradient is the labels).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from catalogue.base_layers import is_base_embedding, is_base_linear
from wire.call.messages import CallKind, LayerKind, LayerSpec, Op
from workers.remote.handle import ExecutorHandle

WeightSource = Callable[[str], torch.Tensor]  # layer name -> its weight as [out, in]


@dataclass(frozen=True)
class PrivacyConfig:
    noise: float = 1.5  # noise std per coordinate, in units of the call's largest row norm
    pad_rows: int = 64  # noise rows prepared per layer at a time
    local_layers: int = 1  # first decoder layers whose projections never leave the tenant
    local_head: bool | None = None  # the output head stays local; None: in trainers only
    seed: int | None = None
    backward: bool = False  # a trainer: gradients are masked too

    def __post_init__(self) -> None:
        if self.noise <= 0 or self.pad_rows < 1 or self.local_layers < 0:
            raise ValueError("noise must be > 0, pad_rows >= 1 and local_layers >= 0")

    @property
    def head_local(self) -> bool:
        return self.backward if self.local_head is None else self.local_head


def local_modules(model: nn.Module, config: PrivacyConfig) -> set[str]:
    """The base layers that privacy mode keeps in the tenant's process."""
    head = model.get_output_embeddings()
    keep = set()
    for name, module in model.named_modules():
        if is_base_embedding(module):
            keep.add(name)
        elif is_base_linear(module):
            block = re.search(r"\.(\d+)\.", f".{name}.")
            if (block and int(block.group(1)) < config.local_layers) or \
                    (module is head and config.head_local):
                keep.add(name)
    return keep


class NoisePad:
    """One layer's one-time pad in one direction: noise rows and their effects, each used once."""

    def __init__(self, spec: LayerSpec, backward: bool, weights: WeightSource,
                 rng: torch.Generator, rows: int) -> None:
        self.spec, self.backward, self.weights, self.rng, self.rows = (spec, backward, weights,
                                                                       rng, rows)
        self.width = spec.out_features if backward else spec.in_features
        self.noise = self.effect = torch.empty(0)
        self.used = 0

    def take(self, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.used + rows > self.noise.shape[0]:
            self.refill(max(rows, self.rows))
        begin, self.used = self.used, self.used + rows
        return self.noise[begin:self.used], self.effect[begin:self.used]

    def refill(self, rows: int) -> None:
        self.noise = torch.randn(rows, self.width, generator=self.rng)
        weight = self._weight()
        self.effect = self.noise @ weight if self.backward else self.noise @ weight.t()
        self.used = 0

    def _weight(self) -> torch.Tensor:
        if self.spec.kind != LayerKind.GROUP:  # the mapped weight itself, no copy in float32
            return self.weights(self.spec.name).to(torch.float32)
        return torch.cat([self.weights(name).to(torch.float32) for name in self.spec.members])


class PrivateExecutor:
    """Wraps an executor handle, masking every floating point input it sends."""

    def __init__(self, inner: ExecutorHandle, config: PrivacyConfig,
                 weights: WeightSource) -> None:
        self.inner, self.config, self.weights = inner, config, weights
        self.model, self.dtype, self.layers = inner.model, inner.dtype, inner.layers
        self.device = getattr(inner, "device", "cpu")
        self._rng = torch.Generator()
        if config.seed is None:
            self._rng.seed()  # from the OS's entropy, not torch's global seed
        else:
            self._rng.manual_seed(config.seed)
        self._pads: dict[tuple[int, bool], NoisePad] = {}

    def call(self, op: Op, layer: int, x: torch.Tensor, kind: CallKind) -> torch.Tensor:
        if not x.is_floating_point():
            raise PermissionError("privacy mode never sends token ids: embeddings stay local")
        if op == Op.FORWARD_NOBIAS:
            raise PermissionError("privacy mode never sends noise to the executor")
        noise, effect = self._pad(layer, op == Op.BACKWARD).take(x.shape[0])
        x = x.to(torch.float32)
        scale = self.config.noise * x.norm(dim=1).max().clamp_min(1e-6)
        masked = self.inner.call(op, layer, x + scale * noise.to(x.device), kind)
        return masked.to(x.device, torch.float32) - scale * effect.to(x.device)

    def close(self) -> None:
        self.inner.close()

    def warm(self, layers: list[int]) -> None:
        """Prepare the first pads of `layers` now (at model build), not at their first call."""
        for layer in layers:
            for backward in (False, True) if self.config.backward else (False,):
                self._pad(layer, backward).refill(self.config.pad_rows)

    def _pad(self, layer: int, backward: bool) -> NoisePad:
        pad = self._pads.get((layer, backward))
        if pad is None:
            pad = self._pads[(layer, backward)] = NoisePad(
                self.layers[layer], backward, self.weights, self._rng, self.config.pad_rows)
        return pad

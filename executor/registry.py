"""The frozen base layers, by stable layer id, and the three operations the executor runs on them
(and the virtual layers built of them: stretches, kept stretches, the lead, greedy steps, the
head's loss).

Loading keeps every frozen weight-bearing layer (nn.Linear, transformers Conv1D, nn.Embedding,
lm_head; tied weights once) and frees the rest of the model. Linear layers that receive the same
input in a forward pass (q/k/v, gate/up) are found by tracing one forward pass and also stored as a
group: one concatenated weight, the members being views into it, so a group costs no extra memory.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from transformers import AutoModelForCausalLM
from transformers.pytorch_utils import Conv1D

from catalogue.base_layers import is_base_embedding, is_base_linear
from catalogue.stretches import RECIPES
from executor import kept, loss, pages, stretches
from executor.columns import Columns
from executor.kernels import Linear, linear
from wire.call.messages import LayerKind, LayerSpec, Op


@dataclass
class BaseLayer:
    spec: LayerSpec
    weight: torch.Tensor  # linear: [out, in] (a transposed view for Conv1D); embedding: table
    bias: torch.Tensor | None = None
    embedding: nn.Module | None = None  # run as is: some models scale inside the embedding
    stretch: stretches.Stretch | stretches.Lead | stretches.Greedy | loss.HeadLoss | None = None


class UnsupportedOp(ValueError):
    pass


FORWARD_ONLY = (LayerKind.LEAD, LayerKind.GREEDY, LayerKind.LOSS)


class LayerRegistry:
    def __init__(self, layers: list[BaseLayer], model_name: str, dtype: torch.dtype) -> None:
        self.layers = layers
        self.model_name = model_name
        self.dtype = dtype
        self.by_name = {layer.spec.name: layer for layer in layers}

    @property
    def specs(self) -> list[LayerSpec]:
        return [layer.spec for layer in self.layers]

    @property
    def offers_head_loss(self) -> bool:
        return any(layer.spec.kind == LayerKind.LOSS for layer in self.layers)

    @classmethod
    def load(cls, path: str | Path, *, dtype: torch.dtype = torch.float32,
             device: str = "cpu", fuse: bool = True, stretch: bool = True,
             head_loss: bool = True, huge_pages: bool = True) -> LayerRegistry:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
        model.eval()
        groups = trace_shared_inputs(model) if fuse else []
        model.to(device)
        if device == "cpu":
            _own_memory(model, huge_pages, {member for group in groups for member in group})
        registry = cls.from_model(model, groups, model_name=Path(path).name, stretch=stretch,
                                  head_loss=head_loss, huge_pages=huge_pages)
        del model
        gc.collect()
        return registry

    @classmethod
    def from_model(cls, model: nn.Module, groups: list[list[str]], *,
                   model_name: str, stretch: bool = False, head_loss: bool = False,
                   huge_pages: bool = False) -> LayerRegistry:
        layers: list[BaseLayer] = []
        dtype = next(model.parameters()).dtype
        for name, module in model.named_modules():
            if not (is_base_linear(module) or is_base_embedding(module)):
                continue
            index = len(layers)
            if is_base_embedding(module):
                module.requires_grad_(False)
                num, dim = module.weight.shape
                spec = LayerSpec(index, name, LayerKind.EMBEDDING, num, dim, False)
                layers.append(BaseLayer(spec, module.weight, embedding=module))
                continue
            weight = module.weight.detach()
            if isinstance(module, Conv1D):
                weight = weight.t()
            bias = None if module.bias is None else module.bias.detach()
            out_features, in_features = weight.shape
            spec = LayerSpec(index, name, LayerKind.LINEAR, in_features, out_features,
                             bias is not None)
            layers.append(BaseLayer(spec, weight, bias))
        by_name = {layer.spec.name: layer for layer in layers}
        fused = {}
        for members in groups:
            layers.append(_fuse(len(layers), [by_name[m] for m in members], huge_pages))
            fused[tuple(members)] = layers[-1]
        if stretch:
            lookups = {layer.spec.name: _lookup(layer) for layer in layers
                       if layer.spec.kind == LayerKind.EMBEDDING}
            built = stretches.build(model, by_name, fused, len(layers), lookups)
            for spec, layer in [*built, *kept.build(len(layers) + len(built), built)]:
                layers.append(BaseLayer(spec, by_name[spec.members[0]].weight, stretch=layer))
        recipe = RECIPES.get(getattr(model.config, "model_type", "")) if head_loss else None
        if recipe is not None and recipe.head in by_name:
            layer = by_name[recipe.head]
            for spec, op in loss.build(len(layers), layer.spec, layer.weight, layer.bias):
                layers.append(BaseLayer(spec, layer.weight, stretch=op))
        return cls(layers, model_name, dtype)

    def get(self, index: int) -> BaseLayer:
        if not 0 <= index < len(self.layers):
            raise KeyError(f"unknown layer index {index}")
        return self.layers[index]

    def runners(self) -> list[dict[int, Callable[[torch.Tensor], torch.Tensor]]]:
        """Per layer index, per op: the function that runs it on a flat batch of rows (what
        `run` decides per call, decided once)."""
        table = []
        for layer in self.layers:
            if layer.spec.kind in FORWARD_ONLY:
                table.append({Op.FORWARD: layer.stretch})
                continue
            if layer.stretch is not None:
                table.append({Op.FORWARD: layer.stretch, Op.BACKWARD: layer.stretch.backward})
                continue
            if layer.spec.kind == LayerKind.EMBEDDING:
                table.append({Op.FORWARD: _lookup(layer)})
                continue
            table.append({Op.FORWARD: Linear(layer.weight, layer.bias),
                          Op.FORWARD_NOBIAS: Linear(layer.weight),
                          Op.BACKWARD: Linear(layer.weight.t())})
        return table

    def columns(self) -> list[dict[int, Columns]]:
        """Per layer index, per op: the op by bands of output columns, where it is one matmul
        (a linear layer or a group; a training batch's slices are cut this way)."""
        table: list[dict[int, Columns]] = []
        for layer in self.layers:
            if layer.stretch is not None or layer.spec.kind == LayerKind.EMBEDDING:
                table.append({})
                continue
            table.append({Op.FORWARD: Columns(layer.weight, layer.bias),
                          Op.FORWARD_NOBIAS: Columns(layer.weight),
                          Op.BACKWARD: Columns(layer.weight.t())})
        return table

    def run(self, op: Op, layer: BaseLayer, x: torch.Tensor) -> torch.Tensor:
        """Run one operation over a flat batch of rows: x [rows, in] (ids [rows] for lookups)."""
        if layer.spec.kind in FORWARD_ONLY:
            if op != Op.FORWARD:
                raise UnsupportedOp(f"{layer.spec.name} is forward only")
            return layer.stretch(x)
        if layer.stretch is not None:
            if op == Op.FORWARD:
                return layer.stretch(x)
            if op == Op.BACKWARD:
                return layer.stretch.backward(x)
            raise UnsupportedOp(f"{layer.spec.name} is a stretch: forward or backward")
        if layer.spec.kind == LayerKind.EMBEDDING:
            if op != Op.FORWARD:
                raise UnsupportedOp(f"{layer.spec.name} is an embedding: only forward lookups")
            return layer.embedding(x)
        if op == Op.BACKWARD:
            return linear(x, layer.weight.t())  # grad_x = grad_y W
        return linear(x, layer.weight, layer.bias if op == Op.FORWARD else None)

    def parameter_bytes(self) -> int:
        seen: set[int] = set()
        total = 0
        for layer in self.layers:
            for t in (layer.weight, layer.bias):
                if t is not None and t.untyped_storage().data_ptr() not in seen:
                    seen.add(t.untyped_storage().data_ptr())
                    total += t.untyped_storage().nbytes()
        return total


def _lookup(layer: BaseLayer) -> Callable[[torch.Tensor], torch.Tensor]:
    """An embedding's forward: the table lookup itself where the module is a plain one, else the
    module (some models scale inside the embedding)."""
    module = layer.embedding
    if type(module) is nn.Embedding and module.max_norm is None:
        return lambda ids, w=layer.weight: F.embedding(ids, w)
    return module


def _own_memory(model: nn.Module, huge_pages: bool, fused: set[str]) -> None:
    """Copy the weights out of the checkpoint's memory map, so the map can go. Otherwise every
    page read while loading (all of them) stays resident in the executor next to the fused
    copies of q/k/v and gate/up: 1.7x the weights for a Llama. Tied weights stay tied.
    With `huge_pages`, the weights of products onto 2 MiB pages (`executor.pages`), except those
    of the modules in `fused` (groups that `_fuse` copies again, onto pages of their own) and the
    embeddings (a lookup reads a row a token): a fresh 2 MiB page can cost 15-30 ms to fault in
    on a VM whose host takes free memory back (a 2-core Xeon: llama-160m's executor ready in
    10.5 s with every weight on them, 3.2 s with none; bench NOTES)."""
    products = {id(module.weight) for name, module in model.named_modules()
                if is_base_linear(module) and name not in fused}
    for param in model.parameters():  # each shared parameter once
        param.data = pages.own_copy(param.data, huge_pages and id(param) in products)


def _fuse(index: int, members: list[BaseLayer], huge_pages: bool) -> BaseLayer:
    """One concatenated weight for layers sharing an input (on the host: written straight into
    memory of its own, on 2 MiB pages with `huge_pages`); the members become views into it."""
    parts = [m.weight for m in members]
    out = None
    if parts[0].device.type == "cpu":
        rows = sum(p.shape[0] for p in parts)
        out = pages.empty((rows, *parts[0].shape[1:]), parts[0].dtype, huge_pages)
    weight = torch.cat(parts, out=out)
    has_bias = any(m.bias is not None for m in members)
    bias = None
    if has_bias:
        bias = torch.cat([
            m.bias if m.bias is not None else weight.new_zeros(m.spec.out_features)
            for m in members
        ])
    start = 0
    for m in members:
        stop = start + m.spec.out_features
        m.weight = weight[start:stop]
        if m.bias is not None:
            m.bias = bias[start:stop]
        start = stop
    spec = LayerSpec(
        index, "+".join(m.spec.name for m in members), LayerKind.GROUP,
        members[0].spec.in_features, start, has_bias,
        members=tuple(m.spec.name for m in members),
        splits=tuple(m.spec.out_features for m in members),
    )
    return BaseLayer(spec, weight, bias)


@torch.no_grad()
def trace_shared_inputs(model: nn.Module) -> list[list[str]]:
    """Groups of linear layers that receive the very same input tensor in one forward pass."""
    seen: list[tuple[str, torch.Tensor]] = []
    hooks = []

    def record(name: str):
        def hook(module: nn.Module, args: tuple) -> None:
            seen.append((name, args[0]))
        return hook

    for name, module in model.named_modules():
        if is_base_linear(module):
            hooks.append(module.register_forward_pre_hook(record(name)))
    try:
        model(input_ids=torch.tensor([[1, 2, 3]]), use_cache=False)
    finally:
        for h in hooks:
            h.remove()
    by_input: dict[int, list[str]] = {}
    for name, x in seen:
        members = by_input.setdefault(id(x), [])
        if name not in members:
            members.append(name)
    return [members for members in by_input.values() if len(members) > 1]

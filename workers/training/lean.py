"""Fewer activations kept for the backward, with gradients bit for bit the same.

A training step keeps, for its backward, the tensors each operation saves. Some of them are
outputs of elementwise work on tensors that are kept anyway: a norm's output (its input is kept
by the norm), an activation function's output (its input is kept by the function) and a gated
MLP's product (both factors' inputs are kept). `keep_less(model)` (a module swap: names and
submodules stay, so adapters load as usual) makes norms, activation functions and gated MLPs
record how their output is made; while the model's forward runs, a saved-tensor hook keeps such
an output as that recipe, and the backward makes it again when it needs it. On llama-1b at
512 tokens that is ~30 of ~69 MB per decoder layer. The recomputed values are the same
elementwise kernels on the same inputs, so the gradients equal those without it.
"""

from __future__ import annotations

import functools
import types
import weakref
from collections.abc import Callable
from contextlib import contextmanager

import torch
from torch import nn

ACTIVATIONS = ("act", "act_fn", "activation_fn")  # the attribute names transformers gives them
# MLPs whose forward is down_proj(act_fn(gate_proj(x)) * up_proj(x)), by class name
GATED = {"LlamaMLP", "MistralMLP", "Qwen2MLP", "Qwen3MLP", "GemmaMLP", "Gemma2MLP"}


class Recipe:
    """How to make a saved tensor again: `make(*inputs)` in `shape`, without autograd. Like a
    saved tensor, it refuses to be used once an input was changed in place."""

    __slots__ = ("inputs", "make", "shape", "versions")

    def __init__(self, make: Callable[..., torch.Tensor], inputs: tuple[torch.Tensor, ...],
                 shape: torch.Size) -> None:
        self.make, self.inputs, self.shape = make, inputs, shape
        self.versions = [t._version for t in inputs]

    def __call__(self) -> torch.Tensor:
        if [t._version for t in self.inputs] != self.versions:
            raise RuntimeError("one of the variables needed for gradient computation has been "
                               "modified by an inplace operation (an input of a kept recipe)")
        with torch.no_grad():
            return self.make(*self.inputs).view(self.shape)


class Recipes:
    """The recipes of one forward, by the output's memory. A saved tensor is matched while that
    output lives (a weak reference: a freed tensor's memory never matches), when it is the output
    or a view of all of it (a Linear saves its input flattened to rows), and only while neither
    it nor the recipe's inputs were changed in place since the output was made."""

    def __init__(self) -> None:
        self._made: dict[int, tuple] = {}
        self._depth = 0

    def record(self, out: torch.Tensor, make: Callable[..., torch.Tensor],
               *inputs: torch.Tensor) -> None:
        if self._depth and torch.is_grad_enabled() and out.is_contiguous():
            self._made[out.untyped_storage().data_ptr()] = (
                weakref.ref(out), out._version, make,
                [(weakref.ref(t), t._version) for t in inputs])

    def pack(self, tensor: torch.Tensor) -> torch.Tensor | Recipe:
        entry = self._made.get(tensor.untyped_storage().data_ptr())
        if entry is None:
            return tensor
        out = entry[0]()
        if out is None or tensor._version != entry[1] or not tensor.is_contiguous() \
                or tensor.numel() != out.numel() \
                or tensor.storage_offset() != out.storage_offset():
            return tensor
        inputs = [ref() for ref, _ in entry[3]]
        if any(t is None or t._version != v for t, (_, v) in zip(inputs, entry[3], strict=True)):
            return tensor
        return Recipe(entry[2], tuple(t.detach() for t in inputs), tensor.shape)

    @staticmethod
    def unpack(packed: torch.Tensor | Recipe) -> torch.Tensor:
        return packed() if isinstance(packed, Recipe) else packed

    @contextmanager
    def active(self):
        self._depth += 1
        try:
            with torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack):
                yield
        finally:
            self._depth -= 1
            if not self._depth:
                self._made.clear()


def _is_norm(module: nn.Module) -> bool:
    return isinstance(module, nn.LayerNorm) or type(module).__name__.endswith("Norm")


def _recorded(module: nn.Module, recipes: Recipes) -> None:
    """`module`'s output is recorded as made from its input by its own forward."""
    forward = module.forward

    @functools.wraps(forward)
    def recording(*args, **kwargs):
        out = forward(*args, **kwargs)
        if len(args) == 1 and not kwargs and isinstance(out, torch.Tensor):
            recipes.record(out, forward, args[0])
        return out

    module.forward = recording


def _gated_forward(self: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The gated MLP's own computation (down(act(gate(x)) * up(x)), calls in that order), with
    the product recorded as made from the gate's and up's outputs."""
    gate = self.gate_proj(x)
    up = self.up_proj(x)
    product = self.lean_product(gate, up)
    self.lean_recipes.record(product, self.lean_product, gate, up)
    return self.down_proj(product)


def _product(self: nn.Module, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return self.act_fn(gate) * up


def keep_less(model: nn.Module) -> Recipes:
    """Record norms', activations' and gated MLPs' outputs, and keep them as recipes while the
    model's forward runs (for `model` or the base model a PeftModel wraps). Returns the recipes."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    recipes = Recipes()
    for name, module in base.named_modules():
        leaf = name.rsplit(".", 1)[-1]
        stateless = next(module.parameters(), None) is None
        if _is_norm(module) or (leaf in ACTIVATIONS and stateless):
            _recorded(module, recipes)
        elif type(module).__name__ in GATED:
            module.lean_recipes = recipes
            module.lean_product = types.MethodType(_product, module)
            module.forward = types.MethodType(_gated_forward, module)
    forward = base.forward

    @functools.wraps(forward)
    def lean(*args, **kwargs):
        with recipes.active():
            return forward(*args, **kwargs)

    base.forward = lean
    return recipes

"""Stretch calls on the worker: a decoder layer whose frozen part after attention is untouched
by adapters makes one executor call for it (`executor.stretches`) instead of four.

`enable_stretches` gives each decoder layer of a supported model a `StretchControl` and a
forward of its own (module swap: names and submodules stay, so adapters load as usual). Per call
that forward checks, cheaply, that the stretch may be used: no autograd (inference), eval mode,
the executor's dtype, and the layer's output projection, norms and MLP (and the next layer's
input norm) not wrapped or hooked by an adapter. Then it runs the input norm and the attention
locally, with the output projection passing its input through, sends [attention output |
residual] to the executor and gets [residual after the MLP | next layer's base q/k/v]; the next
q/k/v wait on their remote layers (`Stage`) for the next layer's normed input, so adapters on
q/k/v (LoRA, IA3) still apply. Otherwise the layer runs its own forward, per projection.
"""

from __future__ import annotations

import types
from typing import Any

import torch
from torch import nn

from catalogue.stretches import RECIPES, Recipe
from wire.executor import CallKind, LayerKind, LayerSpec, Op
from workers.remote.handle import ExecutorHandle
from workers.remote.layers import RemoteLayer, remote_rows


class StretchControl:
    """One decoder layer's stretch: when it may be used, and the call itself."""

    def __init__(self, layer: nn.Module, recipe: Recipe, spec: LayerSpec, handle: ExecutorHandle,
                 targets: list[RemoteLayer], next_layer: nn.Module | None,
                 dtype: torch.dtype) -> None:
        self.layer, self.spec, self.handle, self.dtype = layer, spec, handle, dtype
        self.original = types.MethodType(type(layer).forward, layer)
        self.o: RemoteLayer = layer.get_submodule(recipe.o)
        self.frozen = [(name, layer.get_submodule(name)) for name in
                       (recipe.o, recipe.post_norm, *recipe.mlp_in, recipe.act, recipe.down)]
        self.next_layer = next_layer
        self.next_frozen = [] if next_layer is None else \
            [(recipe.in_norm, next_layer.get_submodule(recipe.in_norm))]
        self.targets = targets  # the next layer's q/k/v remote layers, in the stretch's order
        self.widths = [t.spec.out_features for t in targets]
        self.previous: StretchControl | None = None
        self.waiting: tuple[torch.Tensor, list[torch.Tensor]] | None = None
        self.calls = 0

    def usable(self, hidden_states: torch.Tensor) -> bool:
        if torch.is_grad_enabled() or self.layer.training or hidden_states.dtype != self.dtype:
            return False
        return _untouched(self.layer, self.frozen) and \
            (self.next_layer is None or _untouched(self.next_layer, self.next_frozen))

    def deliver(self, hidden_states: torch.Tensor, normed: torch.Tensor) -> None:
        """The q/k/v this stretch computed ahead, for the next layer whose input is
        `hidden_states` and whose normed input is `normed`."""
        waiting, self.waiting = self.waiting, None
        if waiting is not None and waiting[0] is hidden_states:
            for target, output in zip(self.targets, waiting[1], strict=True):
                target.stage.put(normed, output)

    def run(self, attn: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """One executor call: [attention output | residual] -> the layer's output."""
        rows = torch.cat([attn.reshape(-1, attn.shape[-1]),
                          residual.reshape(-1, residual.shape[-1])], dim=1)
        y = remote_rows(self.handle, Op.FORWARD, self.spec.index, rows, CallKind.INFERENCE,
                        self.spec.out_features, self.dtype)
        self.calls += 1
        hidden = residual.shape[-1]
        h = y[:, :hidden].contiguous().view(residual.shape)
        if self.targets:
            lead = residual.shape[:-1]
            self.waiting = (h, [part.contiguous().view(*lead, part.shape[1])
                                for part in y[:, hidden:].split(self.widths, dim=1)])
        return h


def _untouched(layer: nn.Module, modules: list[tuple[str, nn.Module]]) -> bool:
    """Each module still sits where it was and carries no hook (no adapter wraps it)."""
    for name, module in modules:
        if layer.get_submodule(name) is not module or module._forward_hooks \
                or module._forward_pre_hooks:
            return False
    return True


def enable_stretches(model: nn.Module, handle: ExecutorHandle, dtype: torch.dtype) -> int:
    """Give the decoder layers of `model` stretch calls where the executor offers them (call
    before adapters wrap the model); the number of layers that got one."""
    recipe = RECIPES.get(getattr(model.config, "model_type", ""))
    specs = {s.name: s for s in handle.layers}
    if recipe is None or dtype != handle.dtype:
        return 0
    decoder = model.get_submodule(recipe.layers)
    names = [f"{recipe.layers}.{i}.stretch" for i in range(len(decoder))]
    if not all(name in specs and specs[name].kind == LayerKind.STRETCH for name in names):
        return 0
    modules = dict(model.named_modules())
    controls: list[StretchControl] = []
    for i, layer in enumerate(decoder):
        spec = specs[names[i]]
        targets = []
        for name in spec.members[1:]:  # a group of the next q/k/v, or the layers themselves
            target = specs[name]
            targets += [modules[n] for n in (target.members or (target.name,))]
        following = decoder[i + 1] if i + 1 < len(decoder) else None
        controls.append(StretchControl(layer, recipe, spec, handle, targets, following, dtype))
    forward = _llama_forward if recipe.style == "llama" else _gpt2_forward
    for i, control in enumerate(controls):
        control.previous = controls[i - 1] if i else None
        control.layer.symbiosis_stretch = control
        control.layer.forward = types.MethodType(forward, control.layer)
    return len(controls)


def _llama_forward(self: nn.Module, hidden_states: torch.Tensor,
                   attention_mask: torch.Tensor | None = None,
                   position_ids: torch.LongTensor | None = None, past_key_values: Any = None,
                   use_cache: bool | None = False,
                   position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
                   **kwargs: Any) -> torch.Tensor:
    control: StretchControl = self.symbiosis_stretch
    if not control.usable(hidden_states):
        return control.original(hidden_states, attention_mask=attention_mask,
                                position_ids=position_ids, past_key_values=past_key_values,
                                use_cache=use_cache, position_embeddings=position_embeddings,
                                **kwargs)
    residual = hidden_states
    normed = self.input_layernorm(hidden_states)
    if control.previous is not None:
        control.previous.deliver(hidden_states, normed)
    control.o.stage.passthrough = True
    try:
        attn, _ = self.self_attn(hidden_states=normed, attention_mask=attention_mask,
                                 position_ids=position_ids, past_key_values=past_key_values,
                                 use_cache=use_cache, position_embeddings=position_embeddings,
                                 **kwargs)
    finally:
        control.o.stage.passthrough = False
    return control.run(attn, residual)


def _gpt2_forward(self: nn.Module, hidden_states: torch.Tensor, past_key_values: Any = None,
                  attention_mask: torch.Tensor | None = None,
                  encoder_hidden_states: torch.Tensor | None = None,
                  encoder_attention_mask: torch.Tensor | None = None,
                  use_cache: bool | None = False, **kwargs: Any) -> torch.Tensor:
    control: StretchControl = self.symbiosis_stretch
    if encoder_hidden_states is not None or not control.usable(hidden_states):
        return control.original(hidden_states, past_key_values=past_key_values,
                                attention_mask=attention_mask,
                                encoder_hidden_states=encoder_hidden_states,
                                encoder_attention_mask=encoder_attention_mask,
                                use_cache=use_cache, **kwargs)
    residual = hidden_states
    normed = self.ln_1(hidden_states)
    if control.previous is not None:
        control.previous.deliver(hidden_states, normed)
    control.o.stage.passthrough = True
    try:
        attn, _ = self.attn(normed, past_key_values=past_key_values,
                            attention_mask=attention_mask, use_cache=use_cache, **kwargs)
    finally:
        control.o.stage.passthrough = False
    return control.run(attn, residual)

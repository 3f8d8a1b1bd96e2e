"""Stretch calls on the worker: a decoder layer whose frozen part after attention is untouched
by adapters makes one executor call for it (`executor.stretches`) instead of four (and the first
layer's q/k/v come with the embedding: `workers.remote.lead`).

`enable_stretches` gives each decoder layer of a supported model a `StretchControl` and a
forward of its own (module swap: names and submodules stay, so adapters load as usual). Per call
that forward checks, cheaply, that the stretch may be used: no autograd (inference), eval mode,
the executor's dtype, and the layer's output projection, norms and MLP (and the next layer's
input norm) not wrapped or hooked by an adapter, and, while training, no dropout inside it.
Then it runs the attention locally, with the output projection passing its input through, sends
[attention output | residual] to the executor and gets [residual after the MLP | its norm by the
next layer's input norm | next layer's base q/k/v]. The next layer takes that norm as its normed
input (no second computation of it here) and the q/k/v wait on their remote layers (`Stage`) for
it, so adapters on q/k/v (LoRA, IA3) still apply. In training, for batches
small enough (`TRAIN_MAX_ROWS`, by the executor's device), the call is one autograd node whose
backward is one call too: on a CPU executor through the layer's kept stretch
(`executor.kept`: the forward hands back the MLP's input products and the residual before them,
kept here for the backward, which so computes nothing twice), on a GPU one through the stretch
itself (the executor recomputes the part of the stretch the input gradients need).
Otherwise the layer runs its own forward, per projection.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from catalogue.stretches import RECIPES, Recipe
from wire.call.messages import CallKind, LayerKind, LayerSpec, Op
from workers.remote.handle import ExecutorHandle
from workers.remote.layers import RemoteLayer, remote_rows
from workers.remote.lead import enable_lead
from workers.remote.parts import Parts
from workers.remote.places import Ahead, places, staged_targets, untouched
from workers.remote.tail import Tail, enable_tail
from workers.remote.trained_rows import scattered

# In training a stretch saves calls (a llama-160m step: 27 instead of 97) and runs the frozen
# norms and the MLP's activation in the executor. Its backward needs the MLP's input products:
# the stretch recomputes them (`executor.stretches.Stretch.backward`), worth it where calls, not
# matmuls, dominate (a GPU executor, up to some thousand rows); the kept stretch
# (`executor.kept`) takes them back from the trainer. On a CPU executor (2-core Xeon, llama-160m,
# a lone trainer, plain/ours by `bench.stepprofile`, bench/NOTES.md): 1 x 32 tokens 0.83x kept
# (0.87x with its inputs as parts), 0.73-0.74x per projection, 0.75x recomputing; 1 x 128 0.745x
# kept against 0.751x; 2 x 128 0.77x against 0.83x (the kept stretch's results, 11 MB a call,
# are joined into the call's memory where a projection writes its own in place). So there the
# kept ones, up to 64 rows.
TRAIN_MAX_ROWS = {"cpu": 64, "cuda": 4096}
KEPT = {"cpu": True}  # the executor's devices whose training takes the kept stretches


class StretchControl:
    """One decoder layer's stretch: when it may be used, and the call itself."""

    def __init__(self, layer: nn.Module, recipe: Recipe, spec: LayerSpec, handle: ExecutorHandle,
                 targets: list[RemoteLayer], next_layer: nn.Module | None,
                 dtype: torch.dtype, train_rows: int, kept: LayerSpec | None = None) -> None:
        self.layer, self.spec, self.handle, self.dtype = layer, spec, handle, dtype
        self.kept = kept  # the kept stretch training takes, if any (else the stretch itself)
        self.original = types.MethodType(type(layer).forward, layer)
        self.o: RemoteLayer = layer.get_submodule(recipe.o)
        frozen = [recipe.o, recipe.post_norm, *recipe.mlp_in, recipe.act, recipe.down]
        self.places = places(layer, frozen)  # where the stretch's modules sit, to check per call
        if next_layer is not None:  # and the next layer's input norm
            self.places += places(next_layer, [recipe.in_norm])
        self.targets = targets  # the next layer's q/k/v remote layers, in the stretch's order
        self.widths = [t.spec.out_features for t in targets]
        self.hidden = spec.splits[0]
        # the residual stream, then (where a layer follows) its norm and the next q/k/v
        self.splits = [self.hidden, self.hidden, *self.widths] if targets else [self.hidden]
        # through the kept stretch, what it hands back for the backward too
        self.kept_splits = [*self.splits, kept.splits[-1]] if kept is not None else None
        self.train_rows = train_rows  # the largest training batch (rows) that uses the stretch
        self.train_ok = not any(isinstance(m, nn.Dropout) and m.p > 0
                                for name in frozen for m in layer.get_submodule(name).modules()) \
            and not _dropout_after(layer, recipe)
        self.previous: StretchControl | None = None
        self.tail: Tail | None = None  # the last layer's: on through the head, for decode steps
        self.waiting: Ahead | None = None
        self.calls = 0

    def usable(self, hidden_states: torch.Tensor) -> bool:
        if hidden_states.dtype != self.dtype:
            return False
        if self.layer.training and not self.train_ok:  # dropout inside the stretch
            return False
        if torch.is_grad_enabled() and (hidden_states.numel() > self.train_rows * self.hidden
                                        or self._recomputed()):
            return False
        return untouched(self.places)

    def _recomputed(self) -> bool:
        """Whether the layer recomputes itself in the backward (gradient checkpointing):
        transformers checkpoints the layer class's forward, which the stretch's would bypass,
        keeping every activation; so such a layer trains per projection."""
        return self.layer.training and getattr(self.layer, "gradient_checkpointing", False)

    def take(self, hidden_states: torch.Tensor) -> torch.Tensor | None:
        """The norm this stretch computed of `hidden_states` (its own output), for the next layer
        or the final norm, with what it computed ahead from it (the next q/k/v, or the logits)
        staged on the layers that take it; None if `hidden_states` is not that output, or was
        changed in place since (a hook's doing)."""
        waiting, self.waiting = self.waiting, None
        return None if waiting is None else waiting.hand_over(hidden_states)

    def around_attention(self, hidden: torch.Tensor, norm: Callable[[torch.Tensor], torch.Tensor],
                         attend: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        """A decoder layer's forward with a stretch: the input norm the previous stretch brought
        (with its q/k/v), or `norm`'s; attention with o_proj passed through; then the stretch."""
        normed = self.previous.take(hidden) if self.previous is not None else None
        if normed is None:
            normed = norm(hidden)
        self.o.stage.passthrough = True
        try:
            attn = attend(normed)
        finally:
            self.o.stage.passthrough = False
        return self.run(attn, hidden)

    def run(self, attn: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """One executor call: [attention output | residual] -> the layer's output."""
        attn_rows = attn.reshape(-1, attn.shape[-1])
        residual_rows = residual.reshape(-1, residual.shape[-1])
        self.calls += 1
        targets = self.targets
        training = torch.is_grad_enabled() and (attn.requires_grad or residual.requires_grad)
        chosen = self.chosen(residual)
        if chosen is not None:
            attn_rows, residual_rows = attn_rows[chosen], residual_rows[chosen]
        if training:
            outs = _StretchFn.apply(attn_rows, residual_rows, self)
        else:  # views of one fresh result: nothing holds them but this forward
            rows = torch.cat([attn_rows, residual_rows], dim=1)
            if chosen is None and self.tail is not None and self.tail.usable(residual):
                targets = self.tail.targets
                outs = self.tail.run(self, rows)
            else:
                outs = self.forward_rows(rows, CallKind.INFERENCE, own=False)
        if chosen is not None:  # the last layer's, under the head's loss: no layer follows
            return scattered(outs[0], chosen, residual.shape)
        h = outs[0].view(residual.shape)
        if targets:
            lead = residual.shape[:-1]
            self.waiting = Ahead.of(h, outs[1].view(residual.shape), targets,
                                    [out.view(*lead, out.shape[1]) for out in outs[2:]],
                                    owned=training)
        return h

    def chosen(self, residual: torch.Tensor) -> torch.Tensor | None:
        """The rows a loss wants of the last layer (`workers.remote.trained_rows`), if only some."""
        rows = getattr(self.layer, "symbiosis_trained_rows", None)  # the last layer's only
        return rows.chosen(residual.shape) if rows is not None else None

    def forward_rows(self, rows: torch.Tensor | Parts, kind: CallKind, own: bool = True,
                     spec: LayerSpec | None = None) -> tuple[torch.Tensor, ...]:
        """[rows, attention + hidden] -> (new residual rows, and where a layer follows their
        norm and each next q/k/v's rows; through the kept stretch (`spec`), what it hands
        back for the backward last), each a tensor of its own (`own`, as autograd wants of a
        Function's outputs) or a view of one fresh result."""
        spec = spec or self.spec
        y = remote_rows(self.handle, Op.FORWARD, spec.index, rows, kind, spec.out_features,
                        self.dtype, fresh=not own)
        # the worker's own splits (the next q/k/v one by one, not as the executor groups them)
        splits = self.splits if spec is self.spec else self.kept_splits
        parts = y.split_with_sizes(splits, dim=1)  # Tensor.split: +4 us of Python
        if not own:
            return parts
        # straight out of the call's memory: one copy of the result, not two
        return tuple(part.clone(memory_format=torch.contiguous_format) for part in parts)


class _StretchFn(torch.autograd.Function):
    """A stretch in training: one call forward, one call backward (input gradients only), which
    brings the forward's residual output, and through a kept stretch what its forward handed
    back (`executor.kept`), so the executor need not recompute them."""

    @staticmethod
    def forward(ctx, attn: torch.Tensor, residual: torch.Tensor, control: StretchControl):
        ctx.control, ctx.width = control, attn.shape[1] + residual.shape[1]
        if control.kept is None:
            rows = torch.cat([attn, residual], dim=1)
            outs = control.forward_rows(rows, CallKind.TRAINING)
            ctx.save_for_backward(rows, outs[0])
            return outs
        *outs, handed = control.forward_rows(Parts([attn, residual]), CallKind.TRAINING,
                                             spec=control.kept)  # joined in the call
        ctx.save_for_backward(outs[0], handed)
        return tuple(outs)

    @staticmethod
    def backward(ctx, *grads: torch.Tensor):
        control: StretchControl = ctx.control
        saved = ctx.saved_tensors
        rows = saved[0].shape[0]
        grads = [g if g is not None else saved[0].new_zeros(rows, width)
                 for g, width in zip(grads, control.splits, strict=True)]
        spec = control.spec if control.kept is None else control.kept
        # [inputs | residual output | gradients], or through the kept stretch [residual output |
        # gradients | what its forward handed back]; joined in the call
        order = [*saved, *grads] if control.kept is None else [saved[0], *grads, saved[1]]
        x = Parts(order)
        g = remote_rows(control.handle, Op.BACKWARD, spec.index, x, CallKind.TRAINING,
                        spec.in_features, x.dtype)
        grad_attn, grad_residual = g.split([ctx.width - control.hidden, control.hidden], dim=1)
        return grad_attn, grad_residual, None


def _dropout_after(layer: nn.Module, recipe: Recipe) -> bool:
    """Dropout the attention applies after its output projection (GPT-2's resid_dropout)."""
    attention = layer.get_submodule(recipe.attn)
    return any(isinstance(m, nn.Dropout) and m.p > 0 and "resid" in name
               for name, m in attention.named_modules())


def enable_stretches(model: nn.Module, handle: ExecutorHandle, dtype: torch.dtype,
                     train_rows: int | None = None, kept: bool | None = None) -> int:
    """Give the decoder layers of `model` stretch calls where the executor offers them (call
    before adapters wrap the model); the number of layers that got one. `train_rows`: the
    largest training batch that uses them; `kept`: whether training takes the kept stretches
    where offered (defaults: by the executor's device)."""
    device = getattr(handle, "device", "cpu").split(":")[0]
    if train_rows is None:
        train_rows = TRAIN_MAX_ROWS.get(device, 0)
    if kept is None:
        kept = KEPT.get(device, False)
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
        targets = staged_targets(spec, specs, modules)  # the next q/k/v
        following = decoder[i + 1] if i + 1 < len(decoder) else None
        kept_spec = specs.get(f"{names[i]}+kept") if kept else None
        controls.append(StretchControl(layer, recipe, spec, handle, targets, following, dtype,
                                       train_rows, kept_spec))
    forward = _llama_forward if recipe.style == "llama" else _gpt2_forward
    lead = enable_lead(model, recipe, handle)
    controls[-1].tail = enable_tail(model, recipe, specs, controls[-1], lead)
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
    return control.around_attention(
        hidden_states, self.input_layernorm,
        lambda normed: self.self_attn(hidden_states=normed, attention_mask=attention_mask,
                                      position_ids=position_ids,
                                      past_key_values=past_key_values, use_cache=use_cache,
                                      position_embeddings=position_embeddings, **kwargs)[0])


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
    return control.around_attention(
        hidden_states, self.ln_1,
        lambda normed: self.attn(normed, past_key_values=past_key_values,
                                 attention_mask=attention_mask, use_cache=use_cache,
                                 **kwargs)[0])

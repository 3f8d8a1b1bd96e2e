"""Stretches: the frozen part of a decoder layer between two attentions, run as one call.

For a tenant whose adapters leave it untouched (LoRA on q/v, the most common case), everything
from a layer's attention output to the next layer's q/k/v is frozen: the output projection, the
residual add, the post-attention norm, the whole MLP, the second residual add, the next layer's
input norm and its q/k/v projections. The executor runs that as one call (`Stretch`): it takes
[attention output | residual stream] rows and returns [new residual stream | its norm | next
q/k/v] (the last layer's stretch returns the residual stream alone). The norm comes back because
the worker's adapters on q/k/v take it as their input: the worker need not compute it again. A
decode step then makes one call per layer instead of four. Results equal the per-projection path:
the same modules and weights, in order.
The last layer has a second stretch, `<layer>.stretch+<head>`, that goes on through the final
norm and the output head: [residual stream | its final norm | logits], for decode steps (one
position per sequence, every row's logits wanted), which so save the head's own call.
Before the first layer, the lead (`<embedding>.lead`, where the first layer takes the token
embedding as it is): token ids -> [embedding | its norm | the first layer's q/k/v], so that a
step's first call brings its first q/k/v too. With both, `<layer>.stretch+<head>+lead` (greedy
decode steps) goes through the head and on to the lead of each row's greedy choice, so that a
greedy step makes one call per layer and none more.

Supported where the decoder layer is known to be exactly that sequence (`catalogue.stretches`);
other models keep per-projection calls.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from catalogue.stretches import RECIPES, Recipe
from executor.elementwise import activation_function, norm_function, norm_grad
from executor.kernels import linear
from wire.call.digits import DIGITS, as_digits, greedy_choices
from wire.call.messages import LayerKind, LayerSpec
from wire.call.threads import copy_threads


class Joined:
    """An op whose result is its parts side by side (`parts`, defined by each): joined into a
    tensor of its own, or `into` one given (the client's memory: `Engine._in_place`)."""

    def parts(self, x: torch.Tensor) -> list[torch.Tensor]:
        raise NotImplementedError

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return _joined(self.parts(x))

    def into(self, x: torch.Tensor, out: torch.Tensor) -> None:
        """The parts joined straight into `out`: no result of our own to copy there after,
        one pass over the bytes instead of two."""
        parts = self.parts(x)
        with copy_threads(out):
            if len(parts) == 1:
                out.copy_(parts[0])
            else:
                torch.cat(parts, dim=1, out=out)

    def into_rows(self, x: torch.Tensor, outs: list[torch.Tensor]) -> None:
        """The parts joined straight into several calls' memory, `outs` each call's rows in the
        batch's order: each byte written once, where a joined result of our own, then copied
        call by call, passes over them twice more (a kept stretch's 256 rows, 8.9 MB: 0.8 ms
        against 2.5, 2-core AMD EPYC)."""
        parts, start = self.parts(x), 0
        for out in outs:
            stop = start + out.shape[0]
            with copy_threads(out):
                torch.cat([p[start:stop] for p in parts], dim=1, out=out)
            start = stop


class Stretch(Joined):
    """Forward: x [rows, attention width + hidden] -> [rows, hidden (+ hidden + next q/k/v
    widths)]: the residual stream (and its norm and the next q/k/v).
    Backward (training): [inputs | the forward's residual output | output gradients] -> input
    gradients. Nothing is kept in the executor between forward and backward: the backward
    recomputes what the gradients need and no more (`backward`)."""

    def __init__(self, o, post_norm: nn.Module, mlp_in: list, gated: bool, act: Callable, down,
                 in_norm: nn.Module | None, targets: list) -> None:
        self.o, self.mlp_in, self.down, self.gated, self.targets = o, mlp_in, down, gated, targets
        self.post_norm, self.act = norm_function(post_norm), activation_function(act)
        self.in_norm = None if in_norm is None else norm_function(in_norm)
        self.widths = [o.spec.in_features, o.spec.out_features]

    def backward(self, x: torch.Tensor) -> torch.Tensor:
        """Input gradients by the chain rule backwards through the stretch: the next q/k/v's
        gradients through their weights, the input norm's from the residual output the call
        brings, the down projection's through its weight; autograd only for the part before
        (output projection, norm, MLP input and activation), recomputed. So neither the down
        projection's nor the next q/k/v's products are computed again: of a llama-160m stretch's
        9.4M multiply-adds a row, the recompute does 5.3M."""
        width_in, hidden = sum(self.widths), self.widths[1]
        inputs, out, grad = x.split([width_in, hidden, x.shape[1] - width_in - hidden], dim=1)
        grad_h = self._grad_output(out, grad)
        grad_m = linear(grad_h, self.down.weight.t())  # d = down(m) + h: grad_m = grad_h W
        with torch.enable_grad():
            inputs = inputs.detach().requires_grad_(True)
            h, m = self._mlp(*inputs.split(self.widths, dim=1))
            (grad_in,) = torch.autograd.grad([m, h], inputs, [grad_m, grad_h])
        return grad_in

    def _grad_output(self, out: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
        """The whole gradient at the residual output `out`: its own, and (where a layer
        follows) its norm's and the next q/k/v's, through the norm."""
        if self.in_norm is None:
            return grad
        hidden = self.widths[1]
        grad_out, grad_norm, grad_qkv = grad.split([hidden, hidden, grad.shape[1] - 2 * hidden],
                                                   dim=1)
        widths = [t.spec.out_features for t in self.targets]
        for target, g in zip(self.targets, grad_qkv.split(widths, dim=1), strict=True):
            product = linear(g, target.weight.t())  # q/k/v = norm W^T
            with copy_threads(product):
                grad_norm = grad_norm + product
        through = norm_grad(self.in_norm, out, grad_norm)
        with copy_threads(through):
            return grad_out + through

    def _mlp(self, attn: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The residual stream after attention and the MLP's hidden activations."""
        h = self._attended(attn, residual)
        return h, self._activated(self._inner(h))

    def _attended(self, attn: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        h = linear(attn, self.o.weight, self.o.bias)
        with copy_threads(h):
            h += residual
        return h

    def _inner(self, h: torch.Tensor) -> list[torch.Tensor]:
        """The MLP's input products of the residual stream `h` (one per `mlp_in`)."""
        n = self.post_norm(h)
        return [linear(n, m.weight, m.bias) for m in self.mlp_in]

    def _activated(self, u: list[torch.Tensor]) -> torch.Tensor:
        if self.gated:  # gate and up: fused into one matmul when the registry groups them
            gate, up = u if len(u) == 2 else u[0].chunk(2, dim=1)
            return self.act(gate).mul_(up)
        return self.act(u[0])

    def _parts(self, attn: torch.Tensor, residual: torch.Tensor) -> list[torch.Tensor]:
        """The decoder layer's own arithmetic in its order (so results are bit for bit those
        of its modules), with the fewest tensor ops: each costs 2-5 us of dispatch on a small
        CPU, which is most of a narrow stretch's time (tiny-llama: 180 -> 140 us). Adding in
        place is exact (a + b == b + a) and autograd-safe (no op here saves its output)."""
        return self._out(*self._mlp(attn, residual))

    def _out(self, h: torch.Tensor, m: torch.Tensor) -> list[torch.Tensor]:
        """From the residual stream `h` and the MLP's activations `m`: the new residual stream
        (and where a layer follows its norm and the next q/k/v)."""
        d = linear(m, self.down.weight, self.down.bias)
        with copy_threads(d):
            d += h
        if self.in_norm is None:
            return [d]
        return with_qkv(d, self.in_norm, self.targets)

    def parts(self, x: torch.Tensor) -> list[torch.Tensor]:
        """The forward's result in its parts, before they are joined."""
        width = self.widths[0]
        return self._parts(x[:, :width], x[:, width:])


class Lead(Joined):
    """Forward only: ids [rows] -> [rows, 2 hidden + the first layer's q/k/v widths], the
    lookup, the first layer's input norm and its q/k/v (each as the model computes them)."""

    def __init__(self, lookup: Callable[[torch.Tensor], torch.Tensor], in_norm: nn.Module,
                 targets: list) -> None:
        self.lookup, self.in_norm, self.targets = lookup, norm_function(in_norm), targets

    def parts(self, ids: torch.Tensor) -> list[torch.Tensor]:
        return with_qkv(self.lookup(ids), self.in_norm, self.targets)


class Greedy(Joined):
    """Forward only, for greedy decode steps: the last stretch on through the head (`tail`),
    then the lead (`lead`) for each row's greedy choice (the first of its largest logits):
    [rows, attention width + hidden] -> [tail's output | the choice | the lead's output], the
    choice as base-256 digits (`wire.call.digits`). A worker whose next token is that choice has its
    embedding and first q/k/v without a call of their own."""

    def __init__(self, tail: Stretch, lead: Lead) -> None:
        self.tail, self.lead = tail, lead

    def parts(self, x: torch.Tensor) -> list[torch.Tensor]:
        parts = self.tail.parts(x)
        ids = greedy_choices(parts[-1])  # the logits
        return [*parts, as_digits(ids, parts[0].dtype), *self.lead.parts(ids)]


def with_qkv(h: torch.Tensor, in_norm: Callable[[torch.Tensor], torch.Tensor],
             targets: list) -> list[torch.Tensor]:
    """[h, the normed h, each target's product with it]: the residual stream, the input of
    the adapters on the q/k/v of the layer it goes into (the worker's norm would compute the
    same again), and those q/k/v."""
    n = in_norm(h)
    return [h, n, *(linear(n, t.weight, t.bias) for t in targets)]


def _joined(parts: list[torch.Tensor]) -> torch.Tensor:
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)


def build(model: nn.Module, by_name: dict, groups: dict[tuple[str, ...], object],
          first_index: int, lookups: dict[str, Callable[[torch.Tensor], torch.Tensor]]
          | None = None) -> list[tuple[LayerSpec, Stretch | Lead | Greedy]]:
    """The stretches of `model` with their layer specs, [] if its architecture has no recipe;
    with `lookups` (each embedding's forward, by name) the lead and greedy too. `by_name`: the
    registry's layers; `groups`: fused groups by their members (q/k/v go out in the group's
    layout when there is one)."""
    recipe = RECIPES.get(getattr(model.config, "model_type", ""))
    if recipe is None:
        return []
    decoder = model.get_submodule(recipe.layers)

    def qkv(i: int) -> list:
        names = tuple(f"{recipe.layers}.{i}.{name}" for name in recipe.qkv)
        group = groups.get(names)
        return [group] if group is not None else [by_name[n] for n in names]

    stretches: list[tuple[LayerSpec, Stretch | Lead | Greedy]] = []
    for i in range(len(decoder)):
        in_norm, targets = None, []
        if i + 1 < len(decoder):
            in_norm, targets = decoder[i + 1].get_submodule(recipe.in_norm), qkv(i + 1)
        stretches.append(_stretch(first_index + i, decoder[i], f"{recipe.layers}.{i}", recipe,
                                  by_name, groups, in_norm, targets))
    if recipe.head in by_name:  # the last layer again, through the final norm and the head
        stretches.append(_stretch(first_index + len(decoder), decoder[-1],
                                  f"{recipe.layers}.{len(decoder) - 1}", recipe, by_name, groups,
                                  model.get_submodule(recipe.final_norm), [by_name[recipe.head]],
                                  f"+{recipe.head}"))
    if recipe.embed and recipe.embed in (lookups or {}):
        stretches.append(_lead(first_index + len(stretches), by_name[recipe.embed],
                               lookups[recipe.embed], decoder[0].get_submodule(recipe.in_norm),
                               qkv(0)))
        if recipe.head in by_name:  # the last stretch through the head, then the lead
            stretches.append(_greedy(first_index + len(stretches), *stretches[-2:]))
    return stretches


def _greedy(index: int, tail: tuple[LayerSpec, Stretch],
            lead: tuple[LayerSpec, Lead]) -> tuple[LayerSpec, Greedy]:
    (tail_spec, tail_stretch), (lead_spec, lead_stretch) = tail, lead
    splits = (*tail_spec.splits, DIGITS, *lead_spec.splits)
    spec = LayerSpec(index, f"{tail_spec.name}+lead", LayerKind.GREEDY, tail_spec.in_features,
                     sum(splits), False, members=(*tail_spec.members, *lead_spec.members),
                     splits=splits)
    return spec, Greedy(tail_stretch, lead_stretch)


def _lead(index: int, embedding, lookup: Callable[[torch.Tensor], torch.Tensor],
          in_norm: nn.Module, targets: list) -> tuple[LayerSpec, Lead]:
    in_norm.requires_grad_(False)
    rows, hidden = embedding.spec.in_features, embedding.spec.out_features
    widths = tuple(t.spec.out_features for t in targets)
    spec = LayerSpec(index, f"{embedding.spec.name}.lead", LayerKind.LEAD, rows,
                     2 * hidden + sum(widths), False,
                     members=(embedding.spec.name, *(t.spec.name for t in targets)),
                     splits=(hidden, hidden, *widths))
    return spec, Lead(lookup, in_norm, targets)


def _stretch(index: int, layer: nn.Module, prefix: str, recipe: Recipe, by_name: dict,
             groups: dict, in_norm: nn.Module | None, targets: list, suffix: str = ""
             ) -> tuple[LayerSpec, Stretch]:
    o = by_name[f"{prefix}.{recipe.o}"]
    names = tuple(f"{prefix}.{name}" for name in recipe.mlp_in)
    mlp_in = [groups[names]] if names in groups else [by_name[n] for n in names]
    down = by_name[f"{prefix}.{recipe.down}"]
    hidden = o.spec.out_features
    for module in (layer.get_submodule(recipe.post_norm), in_norm):
        if module is not None:
            module.requires_grad_(False)  # a backward computes input gradients only
    stretch = Stretch(o, layer.get_submodule(recipe.post_norm), mlp_in, len(recipe.mlp_in) == 2,
                      layer.get_submodule(recipe.act), down, in_norm, targets)
    splits = (hidden, hidden, *(t.spec.out_features for t in targets)) if in_norm is not None \
        else (hidden,)
    spec = LayerSpec(index, f"{prefix}.stretch{suffix}", LayerKind.STRETCH,
                     o.spec.in_features + hidden, sum(splits), False,
                     members=(o.spec.name, *(t.spec.name for t in targets)), splits=splits)
    return spec, stretch

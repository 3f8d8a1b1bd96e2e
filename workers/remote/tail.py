"""The last layer's stretch on through the final norm and the output head, for decode steps: the
logits come back with the residual stream (and its final norm), so a step saves the head's own
executor call (and the norm's computation here).

The executor offers it as `<last layer>.stretch+<head>` (`executor.stretches`). The last layer's
`StretchControl` uses it instead of its plain stretch when the call is a decode step (one
position per sequence: every row's logits are wanted), nothing needs gradients, and the final
norm and the head are untouched by adapters (LoRA on the head keeps the plain stretch and its
own head call). The logits wait on the head's stage; the final norm's forward (swapped per
instance, as the decoder layers' are) returns the norm that came back and hands the logits over
with it (or computes its own where its input is not that stream), and the head takes them
when it is called with that output (or a view of all of it, as `hidden[:, -1:]` of one
position is).
Where the lead is on (`workers.remote.lead`), the executor also offers
`<last layer>.stretch+<head>+lead`, which goes on to the lead of each row's greedy choice: the
step's last call brings the next step's first (used when the next token is that choice). The
tail makes that call whenever the lead is usable.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from catalogue.stretches import Recipe
from wire.call.digits import DIGITS
from wire.call.messages import CallKind, LayerKind, LayerSpec, Op
from workers.remote.layers import RemoteLayer, remote_rows
from workers.remote.lead import Lead
from workers.remote.places import places, untouched


class Tail:
    """Where the last stretch may go on to: its spec, the head it computes ahead, and the
    modules that must stay untouched for that; and the greedy call, with the lead it feeds."""

    def __init__(self, model: nn.Module, recipe: Recipe, spec: LayerSpec, head: RemoteLayer,
                 greedy: LayerSpec | None, lead: Lead | None) -> None:
        self.spec = spec
        self.targets = [head]
        self.splits = list(spec.splits)
        self.places = places(model, [recipe.final_norm, recipe.head])
        self.greedy, self.lead = (greedy, lead) if greedy is not None else (None, None)
        if self.lead is not None:  # the tail's parts, the choices, the lead's output
            self.greedy_splits = [*self.splits, DIGITS, self.lead.spec.out_features]
        self.choosing: Choosing | None = None

    def usable(self, residual: torch.Tensor) -> bool:
        return residual.dim() == 3 and residual.shape[1] == 1 and untouched(self.places)

    def run(self, last: Any, rows: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The last stretch's call on through the head (and, where the lead is usable, on to
        the lead of the greedy choices, which it keeps): [residual stream, its final norm,
        logits]."""
        greedy = self.lead is not None and self.lead.usable()
        spec, splits = (self.greedy, self.greedy_splits) if greedy else (self.spec, self.splits)
        choosing = self.choosing if greedy else None
        y = remote_rows(last.handle, Op.FORWARD, spec.index, rows, CallKind.INFERENCE,
                        spec.out_features, last.dtype, fresh=choosing is None)
        parts = y.split_with_sizes(splits, dim=1)
        if greedy:
            self.lead.foresee(parts[3], parts[4])
        if choosing is None:
            return parts[:3]
        # out of the call's memory before the next call: the choices, settled from its logits
        choosing.ids = list(self.lead.foreseen.ids)
        if choosing.settle is not None:
            choosing.settle(choosing.ids, parts[2])
        return parts[0].clone(), parts[1].clone(), parts[2][:, :0]


class Choosing:
    """Around a decode step's forward whose rows all take their greedy choice (`wanted`): the
    tail's greedy call leaves the logits in the call's memory (the head returns [rows, 1, 0])
    and `ids` gets the executor's choices, which `settle` may change from those logits first
    (a row that may not end yet takes its best other token); None where the step made no greedy
    call (the logits came then). Not wanted, or no tail: nothing changes."""

    __slots__ = ("ids", "settle", "tail")

    def __init__(self, tail: Tail | None, wanted: bool,
                 settle: Callable[[list[int], torch.Tensor], None] | None = None) -> None:
        self.tail = tail if wanted else None
        self.ids: list[int] | None = None
        self.settle = settle

    def __enter__(self) -> Choosing:
        if self.tail is not None:
            self.tail.choosing = self
        return self

    def __exit__(self, *exc: object) -> None:
        if self.tail is not None:
            self.tail.choosing = None


def tail_of(model: nn.Module) -> Tail | None:
    """The tail installed in `model` (`enable_tail`), None where there is none."""
    for module in model.modules():
        control = getattr(module, "symbiosis_tail", None)
        if control is not None:
            return control.tail
    return None


def enable_tail(model: nn.Module, recipe: Recipe, specs: dict[str, LayerSpec],
                last: Any, lead: Lead | None) -> Tail | None:
    """The tail for `last` (the last layer's StretchControl) where the executor offers one and
    the head is a remote layer; the final norm then hands the logits over. With `lead`, the
    greedy call too where the executor offers it."""
    spec = specs.get(f"{last.spec.name}+{recipe.head}")
    head = model.get_submodule(recipe.head)
    if spec is None or not isinstance(head, RemoteLayer) or spec.members[-1] != head.spec.name:
        return None
    norm = model.get_submodule(recipe.final_norm)
    norm.symbiosis_tail = last
    norm.forward = types.MethodType(_final_norm_forward, norm)
    greedy = specs.get(f"{spec.name}+lead")
    if lead is None or greedy is None or greedy.kind != LayerKind.GREEDY \
            or greedy.splits != (*spec.splits, DIGITS, *lead.spec.splits):
        greedy = None
    return Tail(model, recipe, spec, head, greedy, lead)


def _final_norm_forward(self: nn.Module, hidden_states: torch.Tensor) -> torch.Tensor:
    normed = self.symbiosis_tail.take(hidden_states)
    return normed if normed is not None else type(self).forward(self, hidden_states)

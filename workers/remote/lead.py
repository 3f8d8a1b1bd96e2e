"""The lead, for the first call of a forward: the token embedding comes back with the first
layer's base q/k/v, so that a decode step makes one call fewer.

The executor offers it as `<embedding>.lead` (`executor.stretches.Lead`) where the first decoder
layer takes the token embedding as it is. The embedding (its forward swapped per instance) uses
it when nothing needs gradients and neither the embedding nor the first layer's input norm is
wrapped or hooked by an adapter; otherwise it makes its plain lookup. The embedding's norm by the
first layer's input norm comes too: that norm (swapped per instance, as the final norm is for the
tail) returns it instead of computing it again and hands the q/k/v to their remote layers'
stages with it; each layer takes its own when it is called with that output, so adapters on
q/k/v (LoRA, IA3) still apply and any other input is computed as usual.
Where the first layer keeps getting something else (prompt tuning puts its virtual tokens before
the embeddings), the q/k/v brought are wasted: after a few such misses the lead stays off.
A decode step's last call (`workers.remote.tail`) brings the lead's output for each row's
greedy choice (`foresee`): where the next ids are those choices, the lead makes no call. Where
they are not (sampling chose otherwise), the executor's work for them is wasted (a lookup, a
norm and the q/k/v of a row, small next to the head): every decode step makes that call, so
that greedy and sampling tenants' last calls share one batch (the head's weight read once).
"""

from __future__ import annotations

import logging
import types
from dataclasses import dataclass

import torch
from torch import nn

from catalogue.stretches import Recipe
from wire.call.digits import from_digits
from wire.call.messages import CallKind, LayerKind, LayerSpec, Op
from workers.remote.handle import ExecutorHandle
from workers.remote.layers import RemoteEmbedding, RemoteLayer, remote_rows
from workers.remote.places import Ahead, places, staged_targets, untouched

log = logging.getLogger("workers.remote.lead")
MAX_MISSES = 3


@dataclass(slots=True)
class Foreseen:
    """The lead's output for the greedy choices of a step, brought by its last call."""

    ids: list[int]
    parts: tuple[torch.Tensor, ...]  # [rows, width] each: the embedding, its norm, the q/k/v


class Lead:
    """The lead call, and the q/k/v it brought until the first layer's input norm takes them."""

    def __init__(self, model: nn.Module, recipe: Recipe, spec: LayerSpec, handle: ExecutorHandle,
                 targets: list[RemoteLayer]) -> None:
        self.spec, self.handle, self.targets = spec, handle, targets
        hidden = spec.splits[0]  # the embedding, its norm, then the first q/k/v
        self.splits = [hidden, hidden, *(t.spec.out_features for t in targets)]
        self.places = places(model, [recipe.embed, f"{recipe.layers}.0.{recipe.in_norm}"])
        self.waiting: Ahead | None = None
        self.enabled = True
        self.misses = 0
        self.foreseen: Foreseen | None = None
        self.choices = [0, 0]  # foreseen choices taken, not taken

    def usable(self) -> bool:
        return self.enabled and not torch.is_grad_enabled() and untouched(self.places)

    def foresee(self, digits: torch.Tensor, output: torch.Tensor) -> None:
        """Keep the lead's `output` [rows, width] for the choices `digits` [rows, DIGITS]: a
        copy, so that the call's result (the logits, most of it) goes when the model's caller
        lets it go."""
        parts = output.clone().split_with_sizes(self.splits, 1)
        self.foreseen = Foreseen(from_digits(digits), parts)

    def run(self, ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """The embedding of `ids`; the q/k/v wait for the first layer's normed input."""
        spec = self.spec
        if self.waiting is not None:  # the last lead's q/k/v were never handed over
            self._miss()
        parts = self._foreseen(ids)
        if parts is None:
            y = remote_rows(self.handle, Op.FORWARD, spec.index, ids, CallKind.INFERENCE,
                            spec.out_features, dtype)
            parts = y.split_with_sizes(self.splits, dim=-1)
        hidden, normed, *qkv = (part.view(*ids.shape, part.shape[-1]) for part in parts)
        self.waiting = Ahead.of(hidden, normed, self.targets, qkv)
        return hidden

    def _foreseen(self, ids: torch.Tensor) -> tuple[torch.Tensor, ...] | None:
        """The foreseen parts if `ids` are the choices they were computed for."""
        foreseen, self.foreseen = self.foreseen, None
        if foreseen is None or len(foreseen.ids) != ids.numel():
            return None  # none, or other rows (a new batch)
        taken = ids.reshape(-1).tolist() == foreseen.ids
        self.choices[not taken] += 1
        return foreseen.parts if taken else None

    def drop_foreseen(self) -> None:
        self.foreseen = None

    def take(self, hidden_states: torch.Tensor) -> torch.Tensor | None:
        """The first layer's norm of `hidden_states` if this lead brought it (the embedding it
        returned, unchanged since), with the q/k/v staged on their layers; None otherwise."""
        waiting, self.waiting = self.waiting, None
        if waiting is None:
            return None
        normed = waiting.hand_over(hidden_states)
        if normed is None:
            self._miss()
        return normed

    def _miss(self) -> None:
        self.misses += 1
        if self.misses >= MAX_MISSES:
            self.enabled = False
            log.info("the first layer's input is not the embedding the lead brought: lead off")


def enable_lead(model: nn.Module, recipe: Recipe, handle: ExecutorHandle) -> Lead | None:
    """The lead for `model` where the executor offers one and the embedding is a remote one."""
    specs = {s.name: s for s in handle.layers}
    spec = specs.get(f"{recipe.embed}.lead") if recipe.embed else None
    if spec is None or spec.kind != LayerKind.LEAD:
        return None
    embedding = model.get_submodule(recipe.embed)
    if not isinstance(embedding, RemoteEmbedding) or spec.members[0] != embedding.spec.name:
        return None
    targets = staged_targets(spec, specs, dict(model.named_modules()))  # the first q/k/v
    if not all(isinstance(t, RemoteLayer) for t in targets):
        return None
    lead = Lead(model, recipe, spec, handle, targets)
    embedding.symbiosis_lead = lead
    embedding.forward = types.MethodType(_embedding_forward, embedding)
    norm = model.get_submodule(f"{recipe.layers}.0.{recipe.in_norm}")
    norm.symbiosis_lead = lead
    norm.forward = types.MethodType(_first_norm_forward, norm)
    return lead


def _embedding_forward(self: RemoteEmbedding, ids: torch.Tensor) -> torch.Tensor:
    lead: Lead = self.symbiosis_lead
    if not lead.usable():
        lead.drop_foreseen()
        return type(self).forward(self, ids)
    return lead.run(ids, self.weight.dtype)


def _first_norm_forward(self: nn.Module, hidden_states: torch.Tensor) -> torch.Tensor:
    normed = self.symbiosis_lead.take(hidden_states)
    return normed if normed is not None else type(self).forward(self, hidden_states)

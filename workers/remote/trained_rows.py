"""The last decoder layer after its attention computes only the rows whose next token is
trained, while the head's loss runs (`workers.remote.loss`).

The head's loss takes the final hidden states of the trained labels' rows only; every earlier
layer must compute every row (the last layer's attention reads their keys and values), but after
the last layer's attention a row that no label trains goes nowhere. A chat job's prompt and a
batch's padding are about half a GSM8K batch's rows, and the last layer's MLP a twentieth of
llama-160m's frozen products. `enable_trained_rows` gives the last decoder layer a `TrainedRows`
(`symbiosis_trained_rows`), which its stretch call reads (`workers.remote.stretch`), and swaps
its MLP's forward for one that runs the chosen rows only (adapters on the MLP's projections
still apply: peft wraps them, not the MLP); the rows left out come back as zeros, which no loss
reads, so the loss and every gradient are plain peft's.
"""

from __future__ import annotations

import types
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from catalogue.stretches import Recipe


class TrainedRows:
    """The rows (of `[batch, length]`) whose next token is trained, while a loss is computed, for
    the decoder layer `layer` (or whose logits a prefill keeps: `workers.remote.kept_rows`)."""

    def __init__(self, layer: nn.Module) -> None:
        self.layer = layer
        self.wanted: torch.Tensor | None = None  # [batch, tokens], right-aligned to the rows
        self.mlp = True  # whether the MLP's own forward takes the wanted rows too
        self.last = 0  # else, where the wanted are each sequence's last so many: those

    @contextmanager
    def only(self, wanted: torch.Tensor, mlp: bool = True, last: int = 0) -> Iterator[None]:
        """`wanted` while the block runs. `mlp=False`: the stretch call only takes them (adapters
        on an MLP that runs per projection may take their rows by the batch's places), or with
        `last`, the MLP too as the last `last` positions of each sequence (the batch's rows
        stay its rows)."""
        before = self.wanted, self.mlp, self.last
        self.wanted, self.mlp, self.last = wanted, mlp, last
        try:
            yield
        finally:
            self.wanted, self.mlp, self.last = before

    def chosen(self, shape: torch.Size) -> torch.Tensor | None:
        """The flat indices of the wanted rows of a `[batch, length, width]` input (virtual
        tokens that prompt tuning prepends are not wanted); None: all rows run (none chosen,
        all of them, not the shape of the batch in hand, or a layer recomputed in the backward,
        as gradient checkpointing does, past the loss)."""
        if not self.fits(shape):
            return None
        wanted = self.wanted
        count = int(wanted.sum())
        if count == 0 or count == shape[0] * shape[1]:
            return None
        if wanted.shape[1] < shape[1]:
            wanted = F.pad(wanted, (shape[1] - wanted.shape[1], 0))
        return wanted.reshape(-1).nonzero().squeeze(1)

    def fits(self, shape: torch.Size) -> bool:
        """Whether rows are wanted of a `[batch, length, width]` input of this shape (the batch
        in hand, `length` counting virtual tokens in front), not recomputed in a backward."""
        wanted = self.wanted
        return wanted is not None and len(shape) == 3 and wanted.shape[0] == shape[0] \
            and wanted.shape[1] <= shape[1] \
            and not (self.layer.training and getattr(self.layer, "gradient_checkpointing", False))


def scattered(rows: torch.Tensor, chosen: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """`rows` (the chosen ones) put back at their places among `shape[:-1]`'s, zeros between."""
    flat = rows.new_zeros(shape[:-1].numel(), rows.shape[-1])
    return flat.index_copy(0, chosen, rows).view(*shape[:-1], rows.shape[-1])


def enable_trained_rows(model: nn.Module, recipe: Recipe) -> TrainedRows:
    """Give the model's last decoder layer (and its MLP) a `TrainedRows`."""
    rows = last_layer_rows(model, recipe)
    mlp = rows.layer.get_submodule(recipe.down.rsplit(".", 1)[0])
    mlp.symbiosis_trained_rows = rows
    mlp.forward = types.MethodType(_mlp_forward, mlp)
    return rows


def last_layer_rows(model: nn.Module, recipe: Recipe) -> TrainedRows:
    """The model's last decoder layer's `TrainedRows`, given one if it has none."""
    layer = model.get_submodule(recipe.layers)[-1]
    if getattr(layer, "symbiosis_trained_rows", None) is None:
        layer.symbiosis_trained_rows = TrainedRows(layer)
    return layer.symbiosis_trained_rows


def _mlp_forward(self: nn.Module, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    """The MLP's own forward, of the chosen rows only where some are (`TrainedRows.chosen`), or
    of each sequence's last positions (`TrainedRows.last`)."""
    forward = type(self).forward
    rows = self.symbiosis_trained_rows
    chosen = rows.chosen(x.shape) if rows.mlp else None
    if chosen is None:
        if rows.last and rows.fits(x.shape):
            y = forward(self, x[:, -rows.last:], *args, **kwargs)
            return F.pad(y, (0, 0, x.shape[1] - rows.last, 0))
        return forward(self, x, *args, **kwargs)
    y = forward(self, x.reshape(-1, x.shape[-1])[chosen].unsqueeze(0), *args, **kwargs)
    return scattered(y[0], chosen, x.shape)

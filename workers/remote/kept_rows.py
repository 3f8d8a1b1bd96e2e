"""A forward that keeps only some positions' logits computes the last decoder layer after its
attention for those rows alone.

A prompt's prefill keeps the logits of its last position (`logits_to_keep=1`), a packed decode
step those of its decode rows and of each prompt that ends in it (a tensor of positions). Every
earlier layer must compute every row (the last layer's attention reads their keys and values),
but after the last layer's attention a row whose logits nobody keeps goes nowhere: the residual
stream there feeds only the final norm and the head, which reads the kept rows. So the model's
forward (swapped per instance: `enable_kept_rows`), without autograd, names the kept rows to the
last layer's `TrainedRows` (`workers.remote.trained_rows`), which that layer's stretch call reads
(`workers.remote.stretch`): the executor runs its output projection, norm and MLP over the kept
rows only, one row of a 512-token prompt's instead of 512 (a twelfth of llama-160m's stretch
work, half of tiny-llama's). The rows left out come back as zeros, which the final norm keeps
zero and the head never reads. A last layer that runs per projection (adapters on its MLP)
gives its MLP each sequence's kept last positions (`TrainedRows.last`), the batch's rows as they
are, since the adapters of a batch of several take their rows by its places; under kept
positions of a tensor (a packed step, whose adapters go by position) that MLP computes every row.
"""

from __future__ import annotations

import functools
import types
from typing import Any

import torch
from torch import nn

from catalogue.stretches import RECIPES
from workers.forward_inputs import forward_tokens
from workers.remote.trained_rows import TrainedRows, last_layer_rows


def enable_kept_rows(model: nn.Module) -> TrainedRows | None:
    """Swap `model`'s forward (a causal LM's, before adapters wrap it) for one that names the rows
    whose logits it keeps to its last decoder layer; None where the architecture has no recipe."""
    recipe = RECIPES.get(getattr(model.config, "model_type", ""))
    if recipe is None:
        return None
    model.symbiosis_kept_rows = last_layer_rows(model, recipe)

    @functools.wraps(type(model).forward)  # its signature, which transformers inspects
    def forward(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
        return _kept_forward(self, args, kwargs)

    model.forward = types.MethodType(forward, model)  # its state read from the model it runs on
    return model.symbiosis_kept_rows


def _kept_forward(model: nn.Module, args: tuple, kwargs: dict[str, Any]) -> Any:
    rows, forward = model.symbiosis_kept_rows, type(model).forward
    keep = kwargs.get("logits_to_keep", 0)
    wanted = None if torch.is_grad_enabled() or rows.wanted is not None \
        else kept_rows(keep, forward_tokens(args, kwargs))
    if wanted is None:
        return forward(model, *args, **kwargs)
    with rows.only(wanted, mlp=False, last=keep if isinstance(keep, int) else 0):
        return forward(model, *args, **kwargs)


def kept_rows(keep: int | torch.Tensor, inputs: torch.Tensor | None) -> torch.Tensor | None:
    """The rows ([batch, length] of `inputs`' first two dimensions) whose logits `keep` keeps, as
    transformers reads it (an int: that many last positions, 0 all; a tensor: those positions);
    None: all of them, or inputs of no such shape."""
    if inputs is None or inputs.dim() < 2:
        return None
    batch, length = inputs.shape[:2]
    if isinstance(keep, torch.Tensor) and keep.dim() == 1:
        positions: torch.Tensor | slice = keep.to(inputs.device)
    elif isinstance(keep, int) and 0 < keep < length:  # not a decode step's one position
        positions = slice(length - keep, None)
    else:
        return None
    wanted = torch.zeros(batch, length, dtype=torch.bool, device=inputs.device)
    wanted[:, positions] = True
    return wanted

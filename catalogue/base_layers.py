"""Which of a model's modules are base layers: the frozen weight-bearing ones the executor holds
and a worker swaps for remote layers. Both sides read this one definition."""

from __future__ import annotations

from torch import nn
from transformers.pytorch_utils import Conv1D


def is_base_linear(module: nn.Module) -> bool:
    return type(module) in (nn.Linear, Conv1D)


def is_base_embedding(module: nn.Module) -> bool:
    return isinstance(module, nn.Embedding)


def base_layer_names(model: nn.Module) -> list[str]:
    """The stable ids of a model's frozen weight-bearing layers, in module order."""
    return [name for name, m in model.named_modules() if is_base_linear(m) or is_base_embedding(m)]

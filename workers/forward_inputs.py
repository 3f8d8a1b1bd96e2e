"""What a model's forward was called with, however it was called."""

from __future__ import annotations

from typing import Any

import torch


def forward_tokens(args: tuple, kwargs: dict[str, Any]) -> torch.Tensor | None:
    """The ids or the embeddings (prompt tuning's, its virtual tokens in front of each row) a
    forward was given, `[batch, length, ...]`; None where there are none of that shape."""
    given = (kwargs.get("input_ids"), kwargs.get("inputs_embeds"), *args[:1])
    return next((t for t in given if isinstance(t, torch.Tensor) and t.dim() > 1), None)

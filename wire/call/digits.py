"""Token ids inside a float result (the greedy choice a `LayerKind.GREEDY` call brings): base-256
digits, most significant first, exact in any float dtype (bfloat16 holds the integers to 256)."""

from __future__ import annotations

import torch

DIGITS = 3  # ids below 2**24
_PLACES = torch.tensor([256 ** (DIGITS - 1 - i) for i in range(DIGITS)])


def as_digits(ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """ids [rows] -> [rows, DIGITS] of `dtype`."""
    places = _PLACES if ids.device.type == "cpu" else _PLACES.to(ids.device)
    return ids[:, None].div(places, rounding_mode="floor").remainder_(256).to(dtype)


def from_digits(digits: torch.Tensor) -> list[int]:
    """[rows, DIGITS] -> the ids, as a list (a step's few rows: one op, not one a digit)."""
    ids = []
    for row in digits.tolist():
        value = 0
        for digit in row:
            value = value * 256 + int(digit)
        ids.append(value)
    return ids

"""Token ids inside a float result (the greedy choice a `LayerKind.GREEDY` call brings): base-256
digits, most significant first, exact in any float dtype (bfloat16 holds the integers to 256)."""

from __future__ import annotations

import functools

import torch

DIGITS = 3  # ids below 2**24


@functools.cache
def _places(device: torch.device) -> torch.Tensor:
    return torch.tensor([256 ** (DIGITS - 1 - i) for i in range(DIGITS)], device=device)


def as_digits(ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """ids [rows] -> [rows, DIGITS] of `dtype`."""
    return ids[:, None].div(_places(ids.device), rounding_mode="floor").remainder_(256).to(dtype)


def from_digits(digits: torch.Tensor) -> list[int]:
    """[rows, DIGITS] -> the ids, as a list (a step's few rows: one op, not one a digit)."""
    ids = []
    for row in digits.tolist():
        value = 0
        for digit in row:
            value = value * 256 + int(digit)
        ids.append(value)
    return ids

"""Token ids inside float rows (the greedy choice a `LayerKind.GREEDY` call brings, the labels a
`LayerKind.LOSS` call takes): base-256 digits, most significant first, exact in any float dtype
(bfloat16 holds the integers to 256); and the greedy choice itself, computed alike by the
executor for that call and by a worker choosing its rows' next tokens."""

from __future__ import annotations

import functools

import numpy
import torch

DIGITS = 3  # ids below 2**24


@functools.cache
def _places(device: torch.device) -> torch.Tensor:
    return torch.tensor([256 ** (DIGITS - 1 - i) for i in range(DIGITS)], device=device)


def as_digits(ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """ids [rows] -> [rows, DIGITS] of `dtype`."""
    return ids[:, None].div(_places(ids.device), rounding_mode="floor").remainder_(256).to(dtype)


def ids_of(digits: torch.Tensor, limit: int) -> torch.Tensor:
    """[rows, DIGITS] of any float dtype -> the ids [rows], -1 where a row's digits are not
    digits (not whole, outside 0..255, NaN) or its id is not below `limit`: a client's bad
    input is a row to ignore, never an index out of range."""
    d = digits.float()
    whole = ((d == d.floor()) & (d >= 0) & (d < 256)).all(1)
    ids = (d.clamp(0, 255).long() * _places(d.device)).sum(1)
    return ids.where(whole & (ids < limit), -1)


def from_digits(digits: torch.Tensor) -> list[int]:
    """[rows, DIGITS] -> the ids, as a list (a step's few rows: one op, not one a digit)."""
    ids = []
    for row in digits.tolist():
        value = 0
        for digit in row:
            value = value * 256 + int(digit)
        ids.append(value)
    return ids


def greedy_choices(logits: torch.Tensor) -> torch.Tensor:
    """logits [rows, vocabulary] -> each row's argmax (its first largest). On a CPU by numpy:
    torch's argmax there is a scalar loop (100 us a row of 50k), numpy's is vectorized (8 us);
    bfloat16, which numpy lacks, widens to float32 first (exactly, ties kept)."""
    if logits.device.type != "cpu":
        return logits.argmax(dim=1)
    if logits.dtype not in (torch.float32, torch.float16):
        logits = logits.float()
    return torch.from_numpy(numpy.argmax(logits.detach().numpy(), axis=1))

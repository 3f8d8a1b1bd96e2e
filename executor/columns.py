"""Slices of a long batch: bands of output columns where the op is one matmul, else rows.

A training batch or a prefill runs in slices so that decode steps get through between them
(`Scheduler`).
Cut by rows, each slice is a short matmul that runs well below the CPU's peak; cut by output
columns, each is a full-height matmul through a narrow band of the weight, which keeps it. 512
rows on a 2-core AMD EPYC (fp32, torch 2.13, GFLOP/s of each way of cutting a batch into slices
of ~0.3-3 ms): 768x768 forward 139-163 by 64-128 columns against 75-105 by 16-64 rows; 768x3072
forward 148-158 against 82-116; 3072x768 backward 133-151 against 78-122. Each band's matmul
writes its part of the result in place; its columns equal the whole matmul's (bit for bit on
that host).

Where the output is too narrow for the slices asked and the sum inside the matmul is deep (an LM
head's backward: 768 columns, each a sum over 32,000 logits), bands of columns would be few and
long and read the weight by strided columns: 57 rows, one thread, AMD EPYC: 12 bands of 4.8 ms
each, 48 GFLOP/s. There the bands cut the sum instead (`inner`): each adds its part of the
inner dimension into the result (0.4-0.8 ms a band, 58-59 GFLOP/s against the whole matmul's
62), equal to the whole to rounding (7e-7 of the largest value there), not bit for bit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

MIN_COLUMNS = 64  # narrower bands run below the peak (64: 112-148 GFLOP/s above)
MIN_ROWS = 64  # likewise for rows (16 rows: 61-84, 64 rows: 104-131 GFLOP/s)
MIN_DEPTH = 256  # likewise for a band of the inner dimension (256-2048: 58-60 GFLOP/s, above)
INNER_RATIO = 4  # the sum is cut only where it is this many times deeper than the output wide
ALIGN = 16  # a band's width: a multiple of the vector registers' widths


@dataclass(frozen=True)
class Columns:
    """An op of the form x @ weight.T (+ bias), computed a band of output columns at a time."""

    weight: torch.Tensor  # [out, in] as the op multiplies (a transposed view for a backward)
    bias: torch.Tensor | None = None

    @property
    def width(self) -> int:
        return self.weight.shape[0]

    @property
    def depth(self) -> int:
        return self.weight.shape[1]

    def inner(self, count: int) -> bool:
        """Whether `count` slices cut the inner dimension: the output has room for fewer bands
        of MIN_COLUMNS and the sum is at least INNER_RATIO times deeper than the output wide."""
        return count > self.width // MIN_COLUMNS and self.depth >= INNER_RATIO * self.width

    def bands(self, count: int) -> list[tuple[int, int]]:
        """About `count` bands of equal width covering the output (none narrower than
        MIN_COLUMNS; one when the op is too narrow to cut), or of the inner dimension where
        `inner(count)` (none shallower than MIN_DEPTH)."""
        span, least = (self.depth, MIN_DEPTH) if self.inner(count) else (self.width, MIN_COLUMNS)
        size = max(least, math.ceil(span / max(count, 1) / ALIGN) * ALIGN)
        return [(start, min(start + size, span)) for start in range(0, span, size)]

    def empty(self, x: torch.Tensor) -> torch.Tensor:
        return x.new_empty((x.shape[0], self.width), dtype=self.weight.dtype)

    def run(self, x: torch.Tensor, band: tuple[int, int], out: torch.Tensor,
            inner: bool = False) -> None:
        """Columns `band` of the result into `out`'s same columns; or, `inner`, the part of the
        sum over inner indices `band` into all of `out` (the first band writes, the rest add)."""
        start, stop = band
        if inner:
            x, weight = x[:, start:stop], self.weight[:, start:stop].t()
            if start:
                out.addmm_(x, weight)
            elif self.bias is None:
                torch.mm(x, weight, out=out)
            else:
                torch.addmm(self.bias, x, weight, out=out)
            return
        weight = self.weight[start:stop].t()
        if self.bias is None:
            torch.mm(x, weight, out=out[:, start:stop])
        else:
            torch.addmm(self.bias[start:stop], x, weight, out=out[:, start:stop])


def row_bands(rows: int, count: int) -> list[tuple[int, int]]:
    """About `count` bands of rows of equal height, none shorter than MIN_ROWS (fewer than twice
    that: one band), for an op that is not one matmul here (a stretch, a layer sharded over a
    group)."""
    size = max(1, math.ceil(rows / max(1, min(count, rows // MIN_ROWS))))
    return [(start, min(start + size, rows)) for start in range(0, rows, size)]

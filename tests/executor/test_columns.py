"""Bands of a long batch's slices: columns of one matmul equal the whole (to rounding), rows
where the op is no single matmul; no band narrower than the floor."""

from __future__ import annotations

import torch

from executor.columns import MIN_COLUMNS, MIN_ROWS, Columns, row_bands


def test_bands_cover_the_output_once_and_none_is_narrower_than_the_floor() -> None:
    columns = Columns(torch.empty(3072, 8))
    assert columns.bands(1) == [(0, 3072)]
    assert columns.bands(4) == [(0, 768), (768, 1536), (1536, 2304), (2304, 3072)]
    assert columns.bands(7) == [(i, min(i + 448, 3072)) for i in range(0, 3072, 448)]
    assert columns.bands(1000) == [(i, i + MIN_COLUMNS) for i in range(0, 3072, MIN_COLUMNS)]
    assert Columns(torch.empty(40, 8)).bands(5) == [(0, 40)]  # too narrow to cut
    assert row_bands(200, 1000) == [(0, 67), (67, 134), (134, 200)]  # no 8-row runt
    assert row_bands(200, 2) == [(0, 100), (100, 200)]
    assert row_bands(MIN_ROWS, 3) == [(0, MIN_ROWS)]
    assert row_bands(2 * MIN_ROWS - 1, 8) == [(0, 2 * MIN_ROWS - 1)]  # a short prefill: whole
    assert row_bands(500, 8) == [(i, min(i + 72, 500)) for i in range(0, 500, 72)]


def test_each_band_computes_its_columns_as_the_whole_matmul_does() -> None:
    torch.manual_seed(0)
    weight, bias = torch.randn(3072, 768), torch.randn(3072)
    x, grad = torch.randn(512, 768), torch.randn(512, 3072)
    cases = [(Columns(weight, bias), x, torch.addmm(bias, x, weight.t())),
             (Columns(weight), x, torch.mm(x, weight.t())),
             (Columns(weight.t()), grad, torch.mm(grad, weight))]  # a backward: grad W
    for columns, inputs, whole in cases:
        out = columns.empty(inputs)
        for band in columns.bands(9):
            columns.run(inputs, band, out)
        torch.testing.assert_close(out, whole, rtol=0, atol=1e-4)  # bit for bit here

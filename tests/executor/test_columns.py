"""Bands of a long batch's slices: columns of one matmul equal the whole (to rounding), rows
where the op is no single matmul; no band narrower than the floor."""

from __future__ import annotations

import torch

from executor.columns import MIN_COLUMNS, MIN_DEPTH, MIN_ROWS, Columns, row_bands


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


def test_a_narrow_output_over_a_deep_sum_is_cut_along_the_sum() -> None:
    head = Columns(torch.empty(32000, 768).t())  # an LM head's backward: 768 wide, 32,000 deep
    assert not head.inner(768 // MIN_COLUMNS) and head.inner(768 // MIN_COLUMNS + 1)
    assert head.bands(100) == [(i, min(i + 320, 32000)) for i in range(0, 32000, 320)]
    assert head.bands(1000) == [(i, min(i + MIN_DEPTH, 32000)) for i in range(0, 32000, MIN_DEPTH)]
    assert not Columns(torch.empty(3072, 768)).inner(1000)  # wide output: its columns
    assert not Columns(torch.empty(768, 2048)).inner(1000)  # deeper, but under 4x: columns


def test_bands_of_the_sum_add_up_to_the_whole_matmul() -> None:
    torch.manual_seed(1)
    weight, bias = torch.randn(96, 4096), torch.randn(96)
    x = torch.randn(57, 4096)
    for columns, whole in ((Columns(weight, bias), torch.addmm(bias, x, weight.t())),
                           (Columns(weight), torch.mm(x, weight.t()))):
        assert columns.inner(3)
        out = columns.empty(x).fill_(float("nan"))  # the first band writes, the rest add
        bands = columns.bands(7)
        assert len(bands) == 7 and bands[-1][1] == 4096
        for band in bands:
            columns.run(x, band, out, inner=True)
        torch.testing.assert_close(out, whole, rtol=1e-5, atol=1e-4)  # to rounding

"""A greedy call's choices travel as base-256 digits in its float result: exact in every float
dtype the executor computes in, for every id below 2**24."""

from __future__ import annotations

import pytest
import torch

from wire.call.digits import as_digits, from_digits


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_ids_come_back_exactly(dtype: torch.dtype) -> None:
    ids = torch.tensor([0, 1, 255, 256, 32_000, 50_258, 65_535, 65_536, 128_255, 2**24 - 1])
    digits = as_digits(ids, dtype)
    assert digits.dtype == dtype and digits.shape == (len(ids), 3)
    assert digits.tolist()[5] == [0, 196, 82]  # 50258 = 196 * 256 + 82
    assert from_digits(digits) == ids.tolist()
    as_plain_float = digits.float() @ torch.tensor([65536.0, 256.0, 1.0])
    assert as_plain_float.long().tolist() == ids.tolist()

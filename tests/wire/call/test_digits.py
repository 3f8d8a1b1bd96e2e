"""A greedy call's choices travel as base-256 digits in its float result: exact in every float
dtype the executor computes in, for every id below 2**24. The choice itself (the executor's for
that call, a worker's for its greedy rows) is torch's argmax, computed faster; on a GPU the same
choices as on the CPU (gpu-marked)."""

from __future__ import annotations

import pytest
import torch

from wire.call.digits import as_digits, from_digits, greedy_choices


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_ids_come_back_exactly(dtype: torch.dtype) -> None:
    ids = torch.tensor([0, 1, 255, 256, 32_000, 50_258, 65_535, 65_536, 128_255, 2**24 - 1])
    digits = as_digits(ids, dtype)
    assert digits.dtype == dtype and digits.shape == (len(ids), 3)
    assert digits.tolist()[5] == [0, 196, 82]  # 50258 = 196 * 256 + 82
    assert from_digits(digits) == ids.tolist()
    as_plain_float = digits.float() @ torch.tensor([65536.0, 256.0, 1.0])
    assert as_plain_float.long().tolist() == ids.tolist()


def _contested(vocabulary: int) -> torch.Tensor:
    """7 rows of logits with ties and maxima at the edges."""
    torch.manual_seed(0)
    logits = torch.randn(7, vocabulary)
    last = vocabulary - 1
    logits[1, 3] = logits[1, last] = 50.0  # a tie far apart: the first
    logits[2, last] = 60.0  # at the very end
    logits[3, last - 1] = logits[3, last] = 70.0  # a tie side by side at the end
    logits[4, 0] = 80.0
    logits[5, 256 % vocabulary] = logits[5, 257 % vocabulary] = 90.0
    return logits


@pytest.mark.parametrize("vocabulary", [50259, 512, 100])
def test_greedy_choices_are_each_rows_first_largest_logit(vocabulary: int) -> None:
    """Greedy's choices (on a CPU by numpy: torch's argmax is a scalar loop there; bfloat16
    widened first) equal argmax, ties included: the first largest, wherever it lies."""
    logits = _contested(vocabulary)
    last = vocabulary - 1
    choices = greedy_choices(logits)
    assert torch.equal(choices, logits.argmax(dim=1))
    assert choices[:5].tolist() == [int(logits[0].argmax()), 3, last, last - 1, 0]
    for dtype in (torch.bfloat16, torch.float16):
        assert torch.equal(greedy_choices(logits.to(dtype)), logits.to(dtype).argmax(dim=1))
        assert greedy_choices(logits[:0].to(dtype)).shape == (0,)  # an empty call
    strided = torch.cat([logits, torch.randn(7, 5)], dim=1)[:, :vocabulary]  # a part's view
    assert not strided.is_contiguous()
    assert torch.equal(greedy_choices(strided), logits.argmax(dim=1))
    with_nan = logits.clone()
    with_nan[6, 2] = float("nan")  # a NaN wins, as in torch's argmax
    assert greedy_choices(with_nan)[6] == with_nan.argmax(dim=1)[6] == 2


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_greedy_choices_on_a_gpu_are_the_cpus(dtype: torch.dtype) -> None:
    """A GPU executor's greedy calls choose on the device: the same ids as the CPU's numpy route,
    ties and NaN included, for a whole tensor and for a part's view."""
    logits = _contested(50259).to(dtype)
    logits[6, 2] = float("nan")
    on_host = greedy_choices(logits)
    assert torch.equal(greedy_choices(logits.to("cuda")).cpu(), on_host)
    strided = torch.cat([logits, logits[:, :5]], dim=1).to("cuda")[:, :50259]
    assert torch.equal(greedy_choices(strided).cpu(), on_host)

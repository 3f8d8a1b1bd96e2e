"""Which rows the last decoder layer computes after its attention under the head's loss
(`workers.remote.trained_rows.TrainedRows.chosen`, right-aligned to the rows as prompt tuning's
virtual tokens come first), and `scattered`, which puts them back; the step itself against peft:
tests/workers/remote/test_loss.py."""

from __future__ import annotations

import torch
from torch import nn

from workers.remote.trained_rows import TrainedRows, scattered


def test_chosen_rows_are_the_wanted_ones_right_aligned() -> None:
    layer = nn.Linear(8, 8)
    rows = TrainedRows(layer)
    wanted = torch.tensor([[False, True, True], [True, False, False]])
    with rows.only(wanted):
        assert rows.chosen(torch.Size([2, 3, 8])).tolist() == [1, 2, 3]
        assert rows.chosen(torch.Size([2, 5, 8])).tolist() == [3, 4, 7]  # 2 virtual tokens
        assert rows.chosen(torch.Size([1, 3, 8])) is None  # not this batch's rows
        assert rows.chosen(torch.Size([2, 2, 8])) is None
        assert rows.chosen(torch.Size([6, 8])) is None
    assert rows.wanted is None and rows.chosen(torch.Size([2, 3, 8])) is None  # outside: all
    for every in (torch.zeros(2, 3, dtype=torch.bool), torch.ones(2, 3, dtype=torch.bool)):
        with rows.only(every):  # none wanted, or all: every row runs, as without
            assert rows.chosen(torch.Size([2, 3, 8])) is None
    layer.gradient_checkpointing = True  # recomputed in the backward, outside the loss
    with rows.only(wanted):
        assert rows.chosen(torch.Size([2, 3, 8])) is None
        layer.eval()  # an evaluation recomputes nothing
        assert rows.chosen(torch.Size([2, 3, 8])).tolist() == [1, 2, 3]


def test_scattered_puts_the_rows_back_with_zeros_between() -> None:
    computed = torch.arange(6.0).view(3, 2)
    out = scattered(computed, torch.tensor([1, 2, 3]), torch.Size([2, 3, 5]))
    expected = torch.zeros(2, 3, 2)
    expected[0, 1:], expected[1, 0] = computed[:2], computed[2]
    assert torch.equal(out, expected)

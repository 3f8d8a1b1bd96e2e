"""A step's micro-batches (`workers.training.loop.micro_batches`): examples of like lengths
together, so that padding costs little, and the step's gradients those of plain peft over the
whole batch padded in one piece."""

from __future__ import annotations

import pytest
import torch

from executor.local import LocalExecutor
from tests.peft_reference import build_pair
from workers.training.data import IGNORE, Example, collate
from workers.training.loop import Hyperparameters, micro_batches, train_step

MODEL = "tiny-llama"


def example(length: int, seed: int) -> Example:
    """`length` tokens, the first third's labels ignored (a prompt's)."""
    ids = torch.randint(3, 250, (length,), generator=torch.Generator().manual_seed(seed)).tolist()
    return Example(ids, [IGNORE] * (length // 3) + ids[length // 3:])


def lengths(groups: list[list[Example]]) -> list[list[int]]:
    return [[len(e.ids) for e in group] for group in groups]


@pytest.mark.parametrize(("given", "limit", "expected"), [
    ([300, 290], 4096, [[290, 300]]),  # 2 % padding: one piece
    ([300, 100, 310], 4096, [[100, 300], [310]]),  # 100 alone is too few rows to run alone
    ([300, 40, 280, 30], 4096, [[30, 40, 280], [300]]),
    ([120, 130, 125, 128, 400], 4096, [[120, 125, 128, 130], [400]]),
    ([200, 200, 200], 500, [[200, 200], [200]]),  # the padded size's cap, as before
    ([900, 10], 500, [[10], [900]]),  # longer than the cap: alone
])
def test_examples_of_like_lengths_go_together(given: list[int], limit: int,
                                              expected: list[list[int]]) -> None:
    examples = [example(n, seed) for seed, n in enumerate(given)]
    assert lengths(micro_batches(examples, limit)) == expected


def test_a_step_in_micro_batches_of_like_lengths_has_plain_pefts_gradients() -> None:
    """SGD at rate 1 without clipping: each parameter moves by minus its gradient; plain peft's
    over the four examples padded into one batch (transformers' mean over the trained labels)."""
    examples = [example(n, seed) for seed, n in enumerate([40, 300, 280, 30])]
    hp = Hyperparameters(1, 4, 1.0, warmup_ratio=0.0, max_grad_norm=0.0)
    assert len(micro_batches(examples, hp.micro_batch_tokens)) == 2
    plain, ours = build_pair(MODEL, "lora", LocalExecutor.load(MODEL))
    plain.train()
    loss = plain(**collate(examples, 0)).loss
    loss.backward()
    expected = {n: p.grad for n, p in plain.named_parameters() if p.requires_grad}
    ours.train()
    before = {n: p.detach().clone() for n, p in ours.named_parameters() if p.requires_grad}
    optimizer = torch.optim.SGD(list(ours.parameters()), lr=1.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    result = train_step(ours, examples, 0, optimizer, schedule, hp)
    moved = {n: before[n] - p.detach() for n, p in ours.named_parameters() if p.requires_grad}
    assert set(moved) == set(expected)
    scale = max(g.abs().max().item() for g in expected.values())
    worst = max((moved[n] - expected[n]).abs().max().item() for n in expected)
    assert scale > 1e-3 and worst < 1e-5 * scale, (worst, scale)
    assert result.loss == pytest.approx(loss.item(), rel=1e-5) and result.tokens == 650

"""The head's loss op (`executor.loss`) against the model's own head, cross-entropy and autograd."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM

from catalogue.resolve import resolve_model
from executor.loss import HeadLoss
from executor.registry import LayerRegistry, UnsupportedOp
from executor.validation import CallRejected, CallTable
from wire.call.digits import DIGITS, as_digits
from wire.call.messages import LayerKind, Op


def reference(model_name: str, hidden: torch.Tensor, labels: torch.Tensor):
    """Per row: (loss, right, the loss's gradient for the row's hidden state), by the model's
    own head, F.cross_entropy and autograd; ignored rows (label -100) give zeros."""
    model = AutoModelForCausalLM.from_pretrained(resolve_model(model_name))
    h = hidden.clone().requires_grad_(True)
    logits = model.get_output_embeddings()(h).float()
    losses = F.cross_entropy(logits, labels, ignore_index=-100, reduction="none")
    losses.sum().backward()
    right = (logits.argmax(1) == labels) & (labels >= 0)
    return losses.detach(), right.float(), h.grad


def labelled(hidden: torch.Tensor, labels: torch.Tensor, vocabulary: int) -> torch.Tensor:
    ids = labels.where(labels >= 0, vocabulary)
    return torch.cat([hidden, as_digits(ids, hidden.dtype)], dim=1)


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-gpt2"])  # gpt2: the head tied to wte
def test_the_loss_its_right_answers_and_gradient_equal_the_heads(name: str) -> None:
    registry = LayerRegistry.load(resolve_model(name))
    layer = registry.by_name["lm_head+loss"]
    vocabulary = registry.by_name["lm_head"].spec.out_features
    assert (layer.spec.kind, layer.spec.in_features, layer.spec.out_features) == (
        LayerKind.LOSS, 64 + DIGITS, 3 + 64)
    torch.manual_seed(0)
    hidden = torch.randn(9, 64)
    head = registry.by_name["lm_head"]
    labels = torch.randint(0, vocabulary, (9,))
    labels[:3] = registry.run(Op.FORWARD, head, hidden[:3]).argmax(1)  # three right answers
    labels[4] = -100
    losses, right, grad = reference(name, hidden, labels)
    y = registry.run(Op.FORWARD, layer, labelled(hidden, labels, vocabulary))
    assert y[:, 1].abs().max() == 0  # float32: the loss needs no remainder
    torch.testing.assert_close(y[:, 0], losses)
    assert y[:, 2].tolist() == right.tolist() and right.sum() == 3
    torch.testing.assert_close(y[:, 3:], grad)
    assert y[4].abs().max() == 0
    evaluation = registry.by_name["lm_head+eval"]  # the same without the gradient
    assert (evaluation.spec.kind, evaluation.spec.in_features, evaluation.spec.out_features,
            evaluation.spec.index) == (LayerKind.LOSS, 64 + DIGITS, 3, layer.spec.index + 1)
    assert torch.equal(registry.run(Op.FORWARD, evaluation, labelled(hidden, labels, vocabulary)),
                       y[:, :3])
    assert 2 * evaluation.stretch.macs_per_row == layer.stretch.macs_per_row == \
        2 * vocabulary * 64


@pytest.mark.parametrize("labels", [[1, 3, -100, 0, 2, 5],  # two rows searched, one right
                                    [1, 3, -100, 1, 1, 1]])  # most rows: all searched
def test_a_right_answer_is_the_first_largest_logit_and_ties_go_to_the_first(
        labels: list[int]) -> None:
    """Tokens 1 and 3 share a head row, so their logits tie: a label of 1 is the greedy choice,
    a label of 3 is not (argmax takes the first largest); the loss and its gradient equal
    F.cross_entropy's whichever rows are searched."""
    weight = torch.randn(6, 4, generator=torch.Generator().manual_seed(3))
    weight[3] = weight[1]
    hidden = weight[1].repeat(6, 1) * 5 + torch.randn(6, 4) * 0.01
    labels = torch.tensor(labels)
    h = hidden.clone().requires_grad_(True)
    logits = h @ weight.t()
    losses = F.cross_entropy(logits, labels, ignore_index=-100, reduction="none")
    losses.sum().backward()
    expected = ((logits.argmax(1) == labels) & (labels >= 0)).float()
    y = HeadLoss(weight, None)(labelled(hidden, labels, 6))
    assert y[:, 2].tolist() == expected.tolist()
    assert expected[1] == 0 and expected.sum() == (labels == 1).sum()  # the tie's second: wrong
    torch.testing.assert_close(y[:, 0], losses.detach())
    torch.testing.assert_close(y[:, 3:], h.grad)


def test_rows_go_through_in_chunks_and_into_a_given_result() -> None:
    registry = LayerRegistry.load(resolve_model("tiny-llama"))
    op = registry.by_name["lm_head+loss"].stretch
    torch.manual_seed(1)
    x = labelled(torch.randn(11, 64), torch.randint(0, 256, (11,)), 256)
    whole = op(x)
    op.chunk = 4  # 4 + 4 + 3 rows
    out = torch.full_like(whole, float("nan"))
    op.into(x, out)
    torch.testing.assert_close(out, whole)


def test_the_logits_live_in_one_room_kept_between_calls_and_shared_with_evaluation() -> None:
    """On a CPU a chunk's logits are written into memory the op keeps (a 50k vocabulary's are
    tens of MB a call, mapped afresh by malloc each time otherwise), grown to the most rows asked
    for; the evaluation op uses the same room, and results do not depend on what it held."""
    registry = LayerRegistry.load(resolve_model("tiny-llama"))
    step, evaluation = (registry.by_name[n].stretch for n in ("lm_head+loss", "lm_head+eval"))
    assert step.room is evaluation.room
    torch.manual_seed(4)
    small, large = (labelled(torch.randn(n, 64), torch.randint(0, 256, (n,)), 256)
                    for n in (3, 7))
    first = step(large)
    memory = step.room.take(7, 256).data_ptr()
    assert step(small).shape == (3, 67) and evaluation(small).shape == (3, 3)
    assert step.room.take(7, 256).data_ptr() == memory  # fewer rows: the same memory
    assert torch.equal(step(large), first)
    assert torch.equal(evaluation(large), first[:, :3])


def test_labels_that_are_not_digits_of_a_token_are_ignored_rows() -> None:
    registry = LayerRegistry.load(resolve_model("tiny-llama"))
    layer = registry.by_name["lm_head+loss"]
    vocabulary = registry.by_name["lm_head"].spec.out_features
    torch.manual_seed(2)
    x = labelled(torch.randn(7, 64), torch.full((7,), 5), vocabulary)
    bad = [(0, 1, float("nan")), (1, 2, 256.0), (2, 0, -1.0), (3, 2, 0.5), (4, 1, float("inf"))]
    for row, column, value in bad:
        x[row, 64 + column] = value
    x[5, 64:] = as_digits(torch.tensor([vocabulary]), x.dtype)[0]  # one past the vocabulary
    y = registry.run(Op.FORWARD, layer, x)
    assert y[:6].abs().max() == 0
    assert y[6, 0] > 0 and y[6, 3:].abs().max() > 0  # the good row is computed
    assert torch.isfinite(y).all()


def test_in_bfloat16_the_remainder_carries_the_loss_past_bfloat16s_digits() -> None:
    registry = LayerRegistry.load(resolve_model("tiny-qwen2"), dtype=torch.bfloat16)
    layer, head = registry.by_name["lm_head+loss"], registry.by_name["lm_head"]
    vocabulary = head.spec.out_features
    torch.manual_seed(3)
    hidden = torch.randn(16, 64).to(torch.bfloat16)
    labels = torch.randint(0, vocabulary, (16,))
    expected = F.cross_entropy(registry.run(Op.FORWARD, head, hidden).float(), labels,
                               reduction="none")  # a trainer's: float32 over bfloat16 logits
    y = registry.run(Op.FORWARD, layer, labelled(hidden, labels, vocabulary))
    assert y.dtype == torch.bfloat16
    high_only = (y[:, 0].float() - expected).abs().max()
    both = (y[:, 0].float() + y[:, 1].float() - expected).abs().max()
    assert high_only > 1e-3 and both < 1e-4 * expected.abs().max(), (high_only, both)


def test_only_forward_and_only_where_the_logits_are_the_heads() -> None:
    registry = LayerRegistry.load(resolve_model("tiny-llama"))
    with pytest.raises(UnsupportedOp):
        registry.run(Op.BACKWARD, registry.by_name["lm_head+loss"], torch.zeros(1, 67))
    table = CallTable(registry.specs)
    index = registry.by_name["lm_head+loss"].spec.index
    assert table.width_out(1, index, Op.FORWARD, torch.float32, (5, 67)) == 67
    for op, shape in ((Op.FORWARD, (5, 64)), (Op.BACKWARD, (5, 67))):
        with pytest.raises(CallRejected):
            table.width_out(1, index, op, torch.float32, shape)
    for name in ("tiny-gemma2", "tiny-starcoder"):  # soft-capped logits; no recipe
        assert not any(s.kind == LayerKind.LOSS for s in LayerRegistry.load(
            resolve_model(name)).specs)
    off = LayerRegistry.load(resolve_model("tiny-llama"), head_loss=False)
    assert not any(s.kind == LayerKind.LOSS for s in off.specs)

"""A training step's loss through the executor's head loss (`workers.remote.loss`) against plain
peft's logits and cross-entropy: the same loss, right answers and adapter gradients, the head
never called for logits, nor the last layer after its attention for rows no label trains; where
the head is adapted, soft-capped or private, the logits path."""

from __future__ import annotations

import pytest
import torch

from executor.local import LocalExecutor
from tests.peft_reference import build_pair
from workers.remote import remote_model
from workers.remote.loss import head_loss
from workers.training.data import IGNORE, Example
from workers.training.loop import evaluate, token_losses

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
# float32 on a GPU against plain peft on the CPU: the head's 50,259-word products and sums run
# in another order (an H200: gradients 1.3e-5 of the largest apart, 4.5e-5 in 3.4)
RELATIVE = {"cpu": 1e-5, "cuda": 1e-4}


def labelled_batch(plain, seed: int = 0) -> dict[str, torch.Tensor]:
    """Two sequences of 9 tokens; some labels ignored, some the plain model's own choice (so
    that right answers are counted), the rest the inputs."""
    ids = torch.randint(3, 250, (2, 9), generator=torch.Generator().manual_seed(seed))
    labels = ids.clone()
    labels[0, :3] = IGNORE
    with torch.no_grad():
        chosen = plain(input_ids=ids).logits[:, -9:].argmax(-1)  # virtual tokens come first
    labels[1, 2:6] = chosen[1, 1:5]
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}


def step(model, batch: dict[str, torch.Tensor]) -> tuple[float, int, int, dict]:
    model.train()
    loss, count, right = token_losses(model, batch)
    loss.backward()
    grads = {n: p.grad.detach().cpu().clone() for n, p in model.named_parameters()
             if p.requires_grad}
    return float(loss.detach()), count, right, grads


def assert_equal_steps(plain, ours, batch: dict[str, torch.Tensor], rel: float = 1e-5) -> None:
    theirs, mine = step(plain, batch), step(ours, {k: v.to(ours.device) for k, v in
                                                     batch.items()})
    assert mine[0] == pytest.approx(theirs[0], rel=rel)
    assert mine[1:3] == theirs[1:3] and theirs[1] == 14 and theirs[2] >= 4, (mine, theirs)
    assert set(mine[3]) == set(theirs[3])
    scale = max(g.abs().max().item() for g in theirs[3].values())
    worst = max((mine[3][n] - theirs[3][n]).abs().max().item() for n in theirs[3])
    assert scale > 1e-3 and worst < rel * scale, (worst, scale)


def assert_equal_evaluations(plain, ours, batch: dict[str, torch.Tensor],
                             rel: float = 1e-5) -> None:
    """The trainer's `evaluate` (mean token loss, accuracy) of both on the batch's examples."""
    examples = [Example(ids.tolist(), labels.tolist())
                for ids, labels in zip(batch["input_ids"], batch["labels"], strict=True)]
    theirs, mine = evaluate(plain, examples, 0, 4096), evaluate(ours, examples, 0, 4096)
    assert mine[0] == pytest.approx(theirs[0], rel=rel)
    assert mine[1] == theirs[1] and theirs[1] >= 4 / 14, (mine, theirs)


@pytest.mark.parametrize(("name", "method"), [
    ("tiny-llama", "lora"), ("tiny-gpt2", "ia3"), ("tiny-qwen2", "prompt_tuning"),
    ("tiny-mistral", "prefix_tuning")])
def test_a_step_through_the_head_loss_equals_peft(name: str, method: str) -> None:
    """One `<head>+loss` call, of the 14 trained labels' rows only (2 of the 16 ignored), and
    after its attention the last layer's calls (its MLP's projections, or its stretch) of those
    rows too (`workers.remote.trained_rows`), the first layer's of every row (18, or 26 with
    prompt tuning's virtual tokens); LoRA and IA3 take the projections, the rest the stretches."""
    called: list[tuple[str, int]] = []
    handle = LocalExecutor.load(name, tap=lambda op, spec, x: called.append((spec.name,
                                                                             x.shape[0])))
    plain, ours = build_pair(name, method, handle)
    batch = labelled_batch(plain)
    assert head_loss(ours) is not None
    assert_equal_steps(plain, ours, batch)
    names = [name for name, _ in called]
    assert ("lm_head+loss", 14) in called and names.count("lm_head+loss") == 1
    assert "lm_head" not in names
    after = {layer: {rows for name, rows in called if f".{layer}.mlp." in name
                     or f".{layer}.stretch" in name} for layer in (0, 1)}  # tiny: 2 layers
    assert after[1] == {14} and len(after[0]) == 1 and min(after[0]) > 14, after


def test_a_step_that_trains_every_label_equals_peft() -> None:
    """Every position's next token trained (labels = inputs, as the bench's jobs train): the
    call's rows are the batch's rows in order, its gradient taken as they come."""
    called: list[tuple[str, int]] = []
    handle = LocalExecutor.load("tiny-llama", tap=lambda op, spec, x: called.append(
        (spec.name, x.shape[0])))
    plain, ours = build_pair("tiny-llama", "lora", handle)
    batch = labelled_batch(plain)
    batch["labels"] = batch["input_ids"].clone()
    theirs, mine = step(plain, batch), step(ours, batch)
    assert mine[0] == pytest.approx(theirs[0], rel=1e-5) and mine[1:3] == theirs[1:3]
    assert theirs[1] == 16 and ("lm_head+loss", 16) in called
    scale = max(g.abs().max().item() for g in theirs[3].values())
    worst = max((mine[3][n] - theirs[3][n]).abs().max().item() for n in theirs[3])
    assert scale > 1e-3 and worst < 1e-5 * scale, (worst, scale)


def test_a_micro_batch_with_nothing_to_learn_makes_no_head_call() -> None:
    """All its labels ignored (a prompt cut off before its answer, say): loss 0 and no
    gradient, as peft's summed cross-entropy gives, and the executor never asked."""
    called: list[str] = []
    handle = LocalExecutor.load("tiny-llama", tap=lambda op, spec, x: called.append(spec.name))
    plain, ours = build_pair("tiny-llama", "lora", handle)
    batch = labelled_batch(plain)
    batch["labels"][:] = IGNORE
    theirs, mine = step(plain, batch), step(ours, batch)
    assert mine[:3] == theirs[:3] == (0.0, 0, 0)
    assert all(g.abs().max() == 0 for g in [*mine[3].values(), *theirs[3].values()])
    assert set(mine[3]) == set(theirs[3])
    assert called and not any(name.startswith("lm_head") for name in called)


@pytest.mark.parametrize("device", DEVICES)
def test_the_head_loss_through_an_executor_process_equals_peft(client_on, device: str) -> None:
    plain, ours = build_pair("tiny-llama", "lora", client_on(device, f"loss-{device}"),
                             device=device)
    assert head_loss(ours) is not None
    assert_equal_steps(plain, ours, labelled_batch(plain, seed=1), RELATIVE[device])
    assert_equal_evaluations(plain, ours, labelled_batch(plain, seed=2), RELATIVE[device])


@pytest.mark.parametrize(("name", "method"), [("tiny-llama", "lora"), ("tiny-gpt2", "ia3"),
                                           ("tiny-mistral", "prefix_tuning")])
def test_an_evaluation_through_the_head_loss_without_its_gradient_equals_peft(
        name: str, method: str) -> None:
    """The trainer's `evaluate` (validation loss and accuracy) calls `<head>+eval` once a
    micro-batch, never the head for logits nor `<head>+loss`, and gives plain peft's figures;
    the last layer after its attention (projections, or a stretch) takes the trained rows only."""
    called: list[tuple[str, int]] = []
    handle = LocalExecutor.load(name, tap=lambda op, spec, x: called.append((spec.name,
                                                                             x.shape[0])))
    plain, ours = build_pair(name, method, handle)
    assert_equal_evaluations(plain, ours, labelled_batch(plain, seed=2))
    names = [name for name, _ in called]
    assert ("lm_head+eval", 14) in called and names.count("lm_head+eval") == 1
    assert "lm_head" not in names and "lm_head+loss" not in names
    assert {rows for name, rows in called if ".1.mlp." in name or ".1.stretch" in name} == {14}


def test_the_logits_path_stays_where_the_head_is_not_the_executors_alone() -> None:
    handle = LocalExecutor.load("tiny-llama")
    plain, ours = build_pair("tiny-llama", "lora_qv_head", handle)  # LoRA on the head
    assert head_loss(ours) is None
    assert_equal_steps(plain, ours, labelled_batch(plain))
    assert head_loss(remote_model("tiny-llama", handle)) is not None
    assert getattr(remote_model("tiny-llama", handle, privacy=True), "symbiosis_head_loss",
                   None) is None  # the labels would reach the executor
    gemma = remote_model("tiny-gemma2", LocalExecutor.load("tiny-gemma2"))
    assert getattr(gemma, "symbiosis_head_loss", None) is None  # soft-capped logits

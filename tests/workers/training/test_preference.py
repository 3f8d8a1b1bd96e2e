"""DPO (`workers.training.preference`) against plain peft and the formula of Rafailov et al.
(2023) written out pair by pair: each output's log-probability summed over its tokens, under the
adapter and under the reference (the model before training: here an adapter that is not the
base model's identity, as a continued job's is), unpadded, one pair at a time. A step in
micro-batches has those gradients; training favours the preferred outputs; a preference file
reads as pairs whose labels are each output's tokens."""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F
from transformers import AutoTokenizer

from catalogue.resolve import resolve_model
from executor.local import LocalExecutor
from tests.peft_reference import build_pair
from workers.remote.loss import head_loss
from workers.remote.privacy import PrivacyConfig
from workers.training import shared_prompt
from workers.training.data import IGNORE, Example, Pair, load_examples
from workers.training.loop import Hyperparameters
from workers.training.preference import (
    evaluate_pairs,
    pair_groups,
    preference_step,
    remember_references,
    sequence_logps,
)

MODEL = "tiny-llama"
BETA = 0.5
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
# float32 on a GPU against plain peft on the CPU: sums in another order (as the head loss's)
RELATIVE = {"cpu": 1e-4, "cuda": 1e-3}


def pair(prompt: int, outputs: tuple[int, int], seed: int) -> Pair:
    """A prompt of `prompt` tokens and two outputs of these lengths."""
    generator = torch.Generator().manual_seed(seed)
    shared = torch.randint(3, 250, (prompt,), generator=generator).tolist()

    def answered(length: int) -> Example:
        output = torch.randint(3, 250, (length,), generator=generator).tolist()
        return Example(shared + output, [IGNORE] * prompt + output)
    return Pair(*(answered(n) for n in outputs))


def logp(model, example: Example) -> torch.Tensor:
    """log p(output | prompt), summed over the output's tokens, the example alone (after any
    virtual tokens the adapter puts before it)."""
    ids = torch.tensor([example.ids])
    logits = model(input_ids=ids).logits[0, -ids.shape[1]:-1].float().log_softmax(-1)
    return sum(logits[t - 1, example.ids[t]] for t in range(1, len(example.ids))
               if example.labels[t] != IGNORE)


def references(plain, pairs: list[Pair]) -> list[list[float]]:
    """Each pair's outputs' log-probabilities under the model as it is."""
    with torch.no_grad():
        return [[float(logp(plain, one.preferred)), float(logp(plain, one.non_preferred))]
                for one in pairs]


def reference_losses(plain, pairs: list[Pair], ref: list[list[float]]) -> list[torch.Tensor]:
    losses = []
    for one, (preferred, non_preferred) in zip(pairs, ref, strict=True):
        policy = [logp(plain, one.preferred), logp(plain, one.non_preferred)]
        losses.append(-F.logsigmoid(BETA * ((policy[0] - preferred) -
                                            (policy[1] - non_preferred))))
    return losses


PAIRS = [((12, (5, 9)), 1), ((30, (20, 4)), 2), ((8, (3, 3)), 3), ((40, (10, 25)), 4)]


@pytest.mark.parametrize("method", ["lora", "lora_qv_head"])
def test_a_step_has_the_gradients_of_the_formula_pair_by_pair(method: str) -> None:
    """Through the executor's head loss (LoRA on the layers: each labelled position's row once
    in `lm_head+eval` for the references and in `lm_head+loss` for the step, never the head's
    logits), or where an adapter on the head keeps the logits path, from the logits."""
    pairs = [pair(prompt, outputs, seed) for (prompt, outputs), seed in PAIRS]
    called: list[tuple[str, int]] = []
    handle = LocalExecutor.load(MODEL, tap=lambda op, spec, x: called.append((spec.name,
                                                                              x.shape[0])))
    plain, ours = build_pair(MODEL, method, handle)
    assert (head_loss(ours) is not None) == (method == "lora")
    assert_step_of_the_formula(plain, ours, pairs, RELATIVE["cpu"])
    labelled = sum(sum(label != IGNORE for label in example.labels)
                   for one in pairs for example in (one.preferred, one.non_preferred))
    rows = {name: sum(n for called_name, n in called if called_name == name)
            for name in ("lm_head", "lm_head+eval", "lm_head+loss")}
    if method == "lora":
        assert rows == {"lm_head": 0, "lm_head+eval": labelled, "lm_head+loss": labelled}
    else:
        assert rows["lm_head"] > 2 * labelled and rows["lm_head+loss"] == 0


@pytest.mark.parametrize("device", DEVICES)
def test_a_step_through_an_executor_process_has_the_formulas_gradients(client_on,
                                                                        device: str) -> None:
    """The trainer's model on `device`, its head loss in the executor's process there."""
    pairs = [pair(prompt, outputs, seed) for (prompt, outputs), seed in PAIRS]
    plain, ours = build_pair(MODEL, "lora", client_on(device, f"dpo-{device}"), device=device)
    assert head_loss(ours) is not None
    assert_step_of_the_formula(plain, ours, pairs, RELATIVE[device])


def test_a_private_step_has_the_formulas_gradients(client_on) -> None:
    """Privacy mode (`workers.remote.privacy`): the labels never reach the executor, so no head
    loss; the logits path under the masks (seeded), as close as without them."""
    pairs = [pair(prompt, outputs, seed) for (prompt, outputs), seed in PAIRS]
    plain, ours = build_pair(MODEL, "lora", client_on("cpu", "dpo-private"),
                             privacy=PrivacyConfig(backward=True, seed=0))
    assert head_loss(ours) is None
    assert_step_of_the_formula(plain, ours, pairs, RELATIVE["cpu"])


def assert_step_of_the_formula(plain, ours, pairs: list[Pair], relative: float) -> None:
    """The references taken, then the adapters moved (as by earlier steps); SGD at rate 1
    without clipping: each parameter moves by minus its gradient, as the formula's."""
    hp = Hyperparameters(1, 4, 1.0, warmup_ratio=0.0, max_grad_norm=0.0, micro_batch_tokens=160)
    assert [len(group) for group in pair_groups(pairs, hp.micro_batch_tokens)] == [2, 1, 1]
    plain.eval()
    ref = references(plain, pairs)
    remember_references(ours, pairs, 0, 64)  # in micro-batches of their own
    for one, expected in zip(pairs, ref, strict=True):
        assert list(one.reference) == pytest.approx(expected, rel=relative / 10)
    generator = torch.Generator().manual_seed(5)
    trainable = dict(ours.named_parameters())
    with torch.no_grad():
        for name, p in plain.named_parameters():
            if p.requires_grad:
                p.add_(0.05 * torch.randn(p.shape, generator=generator))
                trainable[name].copy_(p)
    plain.train()
    losses = reference_losses(plain, pairs, ref)
    (sum(losses) / len(pairs)).backward()
    expected = {n: p.grad for n, p in plain.named_parameters() if p.requires_grad}
    ours.train()
    before = {n: p.detach().clone() for n, p in ours.named_parameters() if p.requires_grad}
    optimizer = torch.optim.SGD(list(ours.parameters()), lr=1.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    result = preference_step(ours, pairs, 0, optimizer, schedule, hp, beta=BETA)
    moved = {n: (before[n] - p.detach()).cpu() for n, p in ours.named_parameters()
             if p.requires_grad}
    assert set(moved) == set(expected)
    scale = max(g.abs().max().item() for g in expected.values())
    worst = max((moved[n] - expected[n]).abs().max().item() for n in expected)
    assert scale > 1e-4 and worst < relative * scale, (worst, scale)  # float32 sums of log-probs
    mean = sum(float(loss.detach()) for loss in losses) / len(pairs)
    assert result.loss == pytest.approx(mean, rel=relative) and mean != pytest.approx(math.log(2))
    assert result.tokens == sum(p.size for p in pairs)


def test_training_favours_the_preferred_outputs() -> None:
    pairs = [pair(prompt, outputs, seed) for (prompt, outputs), seed in PAIRS]
    plain, ours = build_pair(MODEL, "lora", LocalExecutor.load(MODEL))
    hp = Hyperparameters(1, 4, 1e-3, warmup_ratio=0.0)
    optimizer = torch.optim.AdamW([p for p in ours.parameters() if p.requires_grad], lr=1e-3)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    ours.train()
    remember_references(ours, pairs, 0, hp.micro_batch_tokens)
    first = preference_step(ours, pairs, 0, optimizer, schedule, hp, beta=BETA)
    assert first.loss == pytest.approx(math.log(2), rel=1e-5)  # the policy is the reference
    for _ in range(5):
        last = preference_step(ours, pairs, 0, optimizer, schedule, hp, beta=BETA)
    ours.eval()
    loss, favoured = evaluate_pairs(ours, pairs, 0, hp.micro_batch_tokens, beta=BETA)
    trained = dict(ours.named_parameters())
    with torch.no_grad():
        for name, p in plain.named_parameters():
            if p.requires_grad:
                p.copy_(trained[name])
    plain.eval()
    expected = [float(x.detach()) for x in reference_losses(plain, pairs,
                                                   [list(p.reference) for p in pairs])]
    assert loss == pytest.approx(sum(expected) / len(pairs), rel=1e-4)
    assert last.loss < first.loss and loss < math.log(2) and favoured == 1.0


def test_a_preference_file_reads_as_pairs_labelled_on_their_outputs(tmp_path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(resolve_model(MODEL))
    line = {"input": {"messages": [{"role": "user", "content": "Name a colour."}]},
            "preferred_output": [{"role": "assistant", "content": "Blue."}],
            "non_preferred_output": [{"role": "assistant", "content": "I will not."}]}
    path = tmp_path / "prefs.jsonl"
    path.write_text(json.dumps(line) + "\n")
    (one,) = load_examples(path, tokenizer, 512)
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "Name a colour."}],
                                           tokenize=True, return_dict=False,
                                           add_generation_prompt=True)
    for example, text in ((one.preferred, "Blue."), (one.non_preferred, "I will not.")):
        whole = tokenizer.apply_chat_template(
            [{"role": "user", "content": "Name a colour."}, {"role": "assistant",
                                                             "content": text}],
            tokenize=True, return_dict=False)
        assert example.ids == list(whole)
        assert example.labels == [IGNORE] * len(prompt) + list(whole)[len(prompt):]
        assert text in tokenizer.decode([t for t in example.labels if t != IGNORE])


def test_outputs_with_nothing_labelled_make_no_head_call_and_no_gradient() -> None:
    """Both outputs cut off before their first token (a prompt past `max_seq_length`, say):
    each log-probability 0, as the formula's empty sum, and the backward runs, giving the
    adapters no gradient; the executor's head never asked."""
    called: list[str] = []
    handle = LocalExecutor.load(MODEL, tap=lambda op, spec, x: called.append(spec.name))
    _, ours = build_pair(MODEL, "lora", handle)
    one = pair(12, (4, 6), 7)
    for example in (one.preferred, one.non_preferred):
        example.labels = [IGNORE] * len(example.labels)
    ours.train()
    logps = sequence_logps(ours, [one], 0, shared_prompt.layout(ours, [one]))
    assert logps.tolist() == [0.0, 0.0] and logps.requires_grad
    logps.sum().backward()
    grads = [p.grad for p in ours.parameters() if p.requires_grad]
    assert grads and all(g is None or not g.any() for g in grads)
    assert called and not any(name.startswith("lm_head") for name in called)

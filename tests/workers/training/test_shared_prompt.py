"""A DPO pair's prompt run once (`workers.training.shared_prompt`), packed or cached: each
output's log-probability and its gradient against plain peft running each output whole, one at
a time, in every built-in architecture; the rows the executor computes are the prompts' once
and both outputs' from there; where a model cannot share (virtual tokens, recomputed layers, a
short sliding window) the pair runs whole, with the same answers."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from executor.local import LocalExecutor
from tests.peft_reference import build_pair
from tests.workers.training.test_preference import PAIRS, logp, pair, references
from wire.call.messages import Op
from workers.training import shared_prompt
from workers.training.data import IGNORE, Example, Pair
from workers.training.loop import Hyperparameters
from workers.training.methods import recompute_layers
from workers.training.preference import (
    micro_batches,
    pair_groups,
    preference_step,
    sequence_logps,
)

SHARING = {"tiny-llama": True, "tiny-gpt2": True, "tiny-qwen2": True, "tiny-mistral": True,
           "tiny-starcoder": True, "tiny-gemma2": False}  # gemma2: a 16-token sliding window
LAYOUTS = [shared_prompt.PACKED, shared_prompt.CACHED, "eager"]  # eager attention: cached


def test_the_shared_positions_end_before_either_outputs_first_trained_token() -> None:
    def example(ids: list[int], first: int) -> Example:
        return Example(ids, [IGNORE] * first + ids[first:])
    prompt = [5, 6, 7, 8]
    assert shared_prompt.shared_length(Pair(example([*prompt, 9, 10], 4),
                                            example([*prompt, 11], 4))) == 3
    # outputs that begin alike still run from the prompt's last token: it predicts the first
    assert shared_prompt.shared_length(Pair(example([*prompt, 9, 10], 4),
                                            example([*prompt, 9, 11], 4))) == 3
    assert shared_prompt.shared_length(Pair(example([*prompt, 9], 4),
                                            example([5, 6, 1, 8, 9], 4))) == 2
    assert shared_prompt.shared_length(Pair(example([*prompt, 9], 4),
                                            example([4, 6, 7, 8, 9], 4))) == 0
    # a conversation whose earlier answers are trained shares up to the first of them
    assert shared_prompt.shared_length(Pair(example([*prompt, 9], 2),
                                            example([*prompt, 10], 4))) == 1


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("model", sorted(SHARING))
def test_each_outputs_log_probability_and_gradient_are_plain_pefts(monkeypatch, model: str,
                                                                   layout: str) -> None:
    pairs = [pair(prompt, outputs, seed) for (prompt, outputs), seed in PAIRS]
    plain, ours = build_pair(model, "lora", LocalExecutor.load(model))
    expected = into(monkeypatch, ours, layout)
    assert shared_prompt.layout(ours, pairs) == (expected if SHARING[model] else None)
    assert_plain_pefts(plain, ours, pairs)


def into(monkeypatch, model, layout: str) -> str:
    """The layout `layout` asks of `model`: a row wider than 0 positions is cached; eager
    attention (transformers' own, which adds a float mask) is cached too."""
    if layout == shared_prompt.CACHED:
        monkeypatch.setattr(shared_prompt, "PACKED_WIDTH", 0)
    if layout == "eager":
        model.get_base_model().config._attn_implementation = "eager"
        return shared_prompt.CACHED
    return layout


@pytest.mark.parametrize("method", ["prompt_tuning", "prefix_tuning", "recompute_cached",
                                    "recompute_packed"])
def test_recomputed_layers_pack_and_virtual_tokens_run_each_output_whole(monkeypatch,
                                                                         method: str) -> None:
    """Layers recomputed in the backward (gradient checkpointing) pack, and would fill a cache
    twice: where a row does not pack, each output runs whole, as with virtual tokens."""
    pairs = [pair(prompt, outputs, seed) for (prompt, outputs), seed in PAIRS]
    plain, ours = build_pair("tiny-llama", method if "tuning" in method else "lora",
                             LocalExecutor.load("tiny-llama"))
    if method.startswith("recompute"):
        recompute_layers(ours)
    if method == "recompute_cached":
        into(monkeypatch, ours, shared_prompt.CACHED)
    expected = shared_prompt.PACKED if method == "recompute_packed" else None
    assert shared_prompt.layout(ours, pairs) == expected
    assert_plain_pefts(plain, ours, pairs)


@pytest.mark.parametrize("layout", [shared_prompt.PACKED, shared_prompt.CACHED])
def test_a_pair_that_shares_nothing_packs_beside_the_others(monkeypatch, layout: str) -> None:
    """A one-token prompt: its output predicts the first trained token, so nothing runs once.
    Packed, its outputs lie side by side in its row, each from position 0, and the others still
    share; cached (no prompt to keep), every output of the step runs whole."""
    pairs = [pair(prompt, outputs, seed) for (prompt, outputs), seed in PAIRS]
    pairs.insert(1, pair(1, (6, 9), 5))
    assert shared_prompt.shared_length(pairs[1]) == 0
    plain, ours = build_pair("tiny-llama", "lora", LocalExecutor.load("tiny-llama"))
    into(monkeypatch, ours, layout)
    expected = shared_prompt.PACKED if layout == shared_prompt.PACKED else None
    assert shared_prompt.layout(ours, pairs) == expected
    assert shared_prompt.layout(ours, pairs[:1] + pairs[2:]) == layout
    assert_plain_pefts(plain, ours, pairs)


def assert_plain_pefts(plain, ours, pairs: list[Pair]) -> None:
    """Both models in training mode (adapters' dropout is 0): the log-probabilities of all pairs
    in one micro-batch, then the gradients of their sum."""
    plain.train()
    ours.train()
    expected = torch.stack([logp(plain, one.preferred) for one in pairs]
                           + [logp(plain, one.non_preferred) for one in pairs])
    expected.sum().backward()
    logps = sequence_logps(ours, pairs, 0, shared_prompt.layout(ours, pairs))
    assert logps.tolist() == pytest.approx(expected.tolist(), rel=1e-5)
    logps.sum().backward()
    grads = {n: p.grad for n, p in ours.named_parameters() if p.requires_grad}
    for name, p in plain.named_parameters():
        if p.requires_grad:
            scale = p.grad.abs().max().item()
            assert scale > 0 and (grads[name] - p.grad).abs().max().item() < 1e-4 * scale, name


@pytest.mark.parametrize("layout", [shared_prompt.PACKED, shared_prompt.CACHED])
def test_a_step_computes_each_prompt_once_and_each_output_from_its_prompts_last_token(
        monkeypatch, layout: str) -> None:
    """The first decoder layer's rows as the executor computes them, forward and backward: per
    micro-batch, packed, a row a pair of its prompt and both outputs from the prompt's last
    token (padded to the longest); cached, the pairs' prompts (padded to the longest) and both
    outputs of each pair from there (padded to the longest); run whole, both outputs from their
    start. The micro-batches count the positions so: more pairs fit in one than run whole."""
    pairs = [pair(prompt, outputs, seed) for (prompt, outputs), seed in PAIRS]
    rows: Counter[Op] = Counter()

    def tap(op: Op, spec, x: torch.Tensor) -> None:
        if spec.name == "model.layers.0.mlp.down_proj":
            rows[op] += x.shape[0]
    plain, ours = build_pair("tiny-llama", "lora", LocalExecutor.load("tiny-llama", tap=tap))
    into(monkeypatch, ours, layout)
    hp = Hyperparameters(1, 4, 1.0, micro_batch_tokens=200)
    for one, (preferred, non_preferred) in zip(pairs, references(plain, pairs), strict=True):
        one.reference = (preferred, non_preferred)
    optimizer = torch.optim.SGD([p for p in ours.parameters() if p.requires_grad], lr=1e-3)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    ours.train()
    preference_step(ours, pairs, 0, optimizer, schedule, hp, beta=0.5)
    groups = pair_groups(pairs, hp.micro_batch_tokens, layout)
    assert micro_batches(ours, pairs, hp.micro_batch_tokens) == (layout, groups)
    assert [len(group) for group in groups] == ([3, 1] if layout == shared_prompt.PACKED
                                                else [2, 2])
    assert [len(group) for group in pair_groups(pairs, hp.micro_batch_tokens)] == [2, 1, 1]
    shared = whole = 0
    for group in groups:
        cuts = [shared_prompt.shared_length(one) for one in group]
        assert cuts == [next(t for t, label in enumerate(one.preferred.labels) if label != IGNORE)
                        - 1 for one in group]  # random outputs differ at their first token
        sizes = [(one.preferred.size, one.non_preferred.size) for one in group]
        if layout == shared_prompt.PACKED:
            positions = len(group) * max(a + b - cut for (a, b), cut in zip(sizes, cuts,
                                                                             strict=True))
        else:
            positions = len(group) * max(cuts) + 2 * len(group) * max(
                max(size) - cut for size, cut in zip(sizes, cuts, strict=True))
        assert positions <= hp.micro_batch_tokens
        shared += positions
        whole += 2 * len(group) * max(max(size) for size in sizes)
    assert rows == {Op.FORWARD: shared, Op.BACKWARD: shared}
    assert shared < 0.8 * whole

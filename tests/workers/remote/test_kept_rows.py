"""A forward that keeps some positions' logits computes the last layer after its attention for
those rows only (`workers.remote.kept_rows`): the kept logits and every layer's keys and values
against plain transformers + peft, through a real executor process, and the rows the last stretch
took; every row where autograd records, where no logits are kept, and where adapters on the last
MLP take their rows by the whole batch."""

from __future__ import annotations

import inspect

import pytest
import torch

from tests.peft_reference import TOLERANCE, batch, build_pair
from workers.remote.build import remote_model
from workers.remote.client import ExecutorClient
from workers.remote.kept_rows import kept_rows


def test_the_kept_rows_are_those_transformers_keeps_the_logits_of() -> None:
    ids = torch.zeros(2, 5, dtype=torch.long)
    assert kept_rows(1, ids).tolist() == [[False] * 4 + [True]] * 2
    assert kept_rows(2, ids).tolist() == [[False] * 3 + [True] * 2] * 2
    assert kept_rows(torch.tensor([0, 3]), ids).tolist() == [[True, False, False, True, False]] * 2
    embeds = torch.zeros(1, 3, 8)  # inputs_embeds: [batch, length, width]
    assert kept_rows(1, embeds).tolist() == [[False, False, True]]
    for every in (0, 5, 6):  # 0 keeps all logits, as do as many as the positions
        assert kept_rows(every, ids) is None
    assert kept_rows(1, None) is None and kept_rows(1, torch.zeros(5)) is None
    assert kept_rows(torch.tensor([[0]]), ids) is None


def chosen_counts(model, monkeypatch) -> list[int | None]:
    """The rows the last layer's stretch takes, call by call (None: all)."""
    control = model.get_base_model().symbiosis_kept_rows.layer.symbiosis_stretch
    counts: list[int | None] = []
    chosen = control.chosen

    def counted(residual):
        rows = chosen(residual)
        counts.append(None if rows is None else len(rows))
        return rows

    monkeypatch.setattr(control, "chosen", counted)
    return counts


def assert_same_caches(mine, theirs) -> None:
    for layer_mine, layer_theirs in zip(mine.layers, theirs.layers, strict=True):
        torch.testing.assert_close(layer_mine.keys, layer_theirs.keys, rtol=0, atol=TOLERANCE)
        torch.testing.assert_close(layer_mine.values, layer_theirs.values, rtol=0,
                                   atol=TOLERANCE)


@pytest.mark.parametrize(("model", "device"), [
    ("tiny-llama", "cpu"), ("tiny-qwen2", "cpu"), ("tiny-gpt2", "cpu"),
    pytest.param("tiny-llama", "cuda", marks=pytest.mark.gpu)])
def test_a_prefill_runs_the_last_stretch_for_its_kept_rows_only(model: str, device: str,
                                                                 executor_for, client_on,
                                                                 monkeypatch) -> None:
    client = ExecutorClient(executor_for(model).endpoint, name=f"kept-{model}") \
        if device == "cpu" else client_on(device, f"kept-{model}-{device}")
    try:
        plain, ours = build_pair(model, "lora_qv", client, seed=5, device=device)
        plain = plain.to(device).eval()
        ours.eval()
        counts = chosen_counts(ours, monkeypatch)
        ids = batch(6).to(device)  # 2 x 7
        with torch.no_grad():
            for keep, rows in ((1, 2), (torch.tensor([0, 4, 6], device=device), 6), (0, None)):
                mine = ours(input_ids=ids, use_cache=True, logits_to_keep=keep)
                theirs = plain(input_ids=ids, use_cache=True, logits_to_keep=keep)
                assert counts[-1] == rows, (keep, counts)
                torch.testing.assert_close(mine.logits, theirs.logits, rtol=0, atol=TOLERANCE)
                assert_same_caches(mine.past_key_values, theirs.past_key_values)
            # decode on from a trimmed prefill: the cache it left is whole
            first = plain(input_ids=ids, use_cache=True, logits_to_keep=1)
            prefilled = ours(input_ids=ids, use_cache=True, logits_to_keep=1)
            step = first.logits[:, -1:].argmax(-1)
            theirs = plain(input_ids=step, past_key_values=first.past_key_values, use_cache=True)
            mine = ours(input_ids=step, past_key_values=prefilled.past_key_values,
                        use_cache=True)
            torch.testing.assert_close(mine.logits, theirs.logits, rtol=0, atol=TOLERANCE)
        ours.train()  # a training forward computes every row, as the loss decides its own
        ours(input_ids=ids, logits_to_keep=1).logits.sum().backward()
        assert counts[-1] is None
    finally:
        if device == "cpu":
            client.close()


def test_adapters_on_the_last_mlp_see_their_sequences_kept_positions(client_on) -> None:
    """An adapter on the last MLP's projections keeps the layer off its stretch: its MLP then
    takes each sequence's kept last positions, the batch's rows as they are (whose places the
    adapters' rows follow), or every row for kept positions of a tensor (a packed step, whose
    adapters go by position); the logits are plain's."""
    plain, ours = build_pair("tiny-llama", "lora", client_on("cpu", "kept-mlp"), seed=7)
    plain.eval()
    ours.eval()
    shapes = []
    projection = ours.get_base_model().model.layers[-1].mlp.gate_proj
    projection.register_forward_hook(
        lambda module, args, out: shapes.append(tuple(args[0].shape[:2])))
    ids = batch(8)
    with torch.no_grad():
        for keep, shape in ((1, (2, 1)), (3, (2, 3)), (torch.tensor([1, 6]), (2, 7))):
            mine = ours(input_ids=ids, logits_to_keep=keep).logits
            theirs = plain(input_ids=ids, logits_to_keep=keep).logits
            assert shapes[-1] == shape, (keep, shapes)
            torch.testing.assert_close(mine, theirs, rtol=0, atol=TOLERANCE)


def test_the_forward_keeps_its_signature(client_on) -> None:
    """transformers' generate() passes `logits_to_keep` where the forward's signature names it."""
    model = remote_model("tiny-llama", client_on("cpu", "kept-signature"))
    assert model.forward.__self__ is model
    assert "logits_to_keep" in inspect.signature(model.forward).parameters
    assert model._supports_logits_to_keep()

"""Decode attention per run of rows from their first real position: the cheapest split, each
row's output as if it ran alone, its padding never read, and every architecture's tokens those
of plain generate() (through an executor on a GPU too)."""

from __future__ import annotations

import itertools
import random

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache

from catalogue.resolve import resolve_model
from executor.local import LocalExecutor
from tests.conftest import TINY_MODELS
from tests.peft_reference import build_pair
from tests.workers.inference.test_engine import generated, text
from wire import manager as W
from workers.inference.batch import BatchCache
from workers.inference.engine import InferenceEngine
from workers.inference.request import Request
from workers.inference.rooms import RoomyLayer
from workers.inference.row_attention import install, plan


def read(starts: tuple[int, ...], groups: tuple[tuple[int, int, int], ...], call: int) -> int:
    """What a plan costs: positions read beyond each row's width share, plus its calls."""
    groups = groups or ((0, len(starts), 0),)
    return sum(call - (end - first) * start for first, end, start in groups)


def test_a_plan_splits_where_the_padding_skipped_outweighs_a_call() -> None:
    assert plan((0, 0, 0), 64) == ()  # no padding: one call over the width, as sdpa
    assert plan((0, 3, 5), 64) == ()  # a few positions are not worth a call
    assert plan((5, 5, 5), 64) == ((0, 3, 5),)  # padding every row shares is skipped anyway
    assert plan((900, 900, 0, 900), 64) == ((0, 2, 900), (2, 3, 0), (3, 4, 900))
    assert plan((900, 0), 1000) == ()  # one row's 900 positions cost less than a call


def test_a_plan_reads_the_least_of_all_splits_into_runs() -> None:
    rng = random.Random(0)
    for _ in range(200):
        starts = tuple(rng.choice([0, 3, 40, 200, 900]) for _ in range(rng.randint(1, 7)))
        call = rng.choice([0, 16, 128, 1000])
        cheapest = min(
            read(starts, tuple((a, b, min(starts[a:b])) for a, b in itertools.pairwise(cuts)),
                 call)
            for inner in itertools.chain.from_iterable(
                itertools.combinations(range(1, len(starts)), k) for k in range(len(starts)))
            for cuts in [(0, *inner, len(starts))])
        chosen = plan(starts, call)
        assert read(starts, chosen, call) == cheapest, (starts, call)
        assert all(start <= starts[row] for first, end, start in chosen
                   for row in range(first, end))


@pytest.fixture(scope="module")
def tiny_llama():
    model = AutoModelForCausalLM.from_pretrained(resolve_model("tiny-llama")).eval()
    assert install(model)  # grouped heads: 4 query heads over 2 of keys and values
    return model


def alone(model, prompt: list[int], token: int) -> torch.Tensor:
    """The logits of `token` after `prompt`, the row alone in plain transformers."""
    with torch.no_grad():
        cache = DynamicCache()
        model(input_ids=torch.tensor([prompt]), past_key_values=cache, use_cache=True)
        out = model(input_ids=torch.tensor([[token]]), past_key_values=cache, use_cache=True,
                    position_ids=torch.tensor([[len(prompt)]]))
    return out.logits[0, -1]


def joined(model, prompts: list[list[int]]) -> BatchCache:
    """A batch of `prompts`' rows, each prefilled alone in plain transformers and joined."""
    batch = BatchCache()
    with torch.no_grad():
        for prompt in prompts:
            cache = DynamicCache()
            model(input_ids=torch.tensor([prompt]), past_key_values=cache, use_cache=True)
            batch.join([(layer.keys, layer.values) for layer in cache.layers],
                       torch.ones(1, len(prompt), dtype=torch.long))
    return batch


def test_rows_read_from_their_own_first_position_as_if_alone(tiny_llama) -> None:
    """Rows of 3, 40 and 12 tokens in one batch, their padding poisoned with NaN: a decode step
    by runs gives each row its own logits; over the padded width (masked) it reads the NaN."""
    prompts = [list(range(5, 8)), list(range(100, 140)), list(range(7, 19))]
    batch = joined(tiny_llama, prompts)
    for layer in batch.cache.layers:
        for row, start in enumerate(batch.starts):
            layer.keys[row, :, :start] = layer.values[row, :, :start] = float("nan")
    assert batch.starts == (37, 0, 28)
    groups = plan(batch.starts, 0)
    assert groups == ((0, 1, 37), (1, 2, 0), (2, 3, 28))
    tokens = torch.tensor([[1], [2], [3]])
    cache, mask, positions = batch.step_inputs()
    with torch.no_grad():
        out = tiny_llama(input_ids=tokens, attention_mask=mask, position_ids=positions,
                         past_key_values=cache, use_cache=True, row_groups=groups)
        for row, prompt in enumerate(prompts):
            torch.testing.assert_close(out.logits[row, -1], alone(tiny_llama, prompt, row + 1))
        cache, mask, positions = batch.step_inputs()  # a step more over the padded width

        padded = tiny_llama(input_ids=tokens, attention_mask=mask, position_ids=positions,
                            past_key_values=cache, use_cache=True)
    assert padded.logits[[0, 2]].isnan().all() and not padded.logits[1].isnan().any()


def counting(counts: dict[str, int], name: str):
    """`RoomyLayer`'s own method `name`, counted."""
    real = getattr(RoomyLayer, name)

    def counted(layer: RoomyLayer, *args):
        counts[name] += 1
        return real(layer, *args)
    return counted


@pytest.mark.parametrize("model", TINY_MODELS)
def test_rows_of_every_architecture_decode_by_runs_as_plain_generate(model, monkeypatch) -> None:
    """Prompts arriving apart join the batch at other lengths; every step's rows attend by runs
    (a call costing nothing: each row from its own first position) where the attention is
    sdpa, gemma2's eager attention (soft caps) is left as it is. Rows leave the rooms in place
    and later ones join in the rows they left."""
    tokenizer = AutoTokenizer.from_pretrained(resolve_model(model))
    plain, ours = build_pair(model, "lora", LocalExecutor.load(model))
    engine = InferenceEngine(ours.eval(), tokenizer, max_context=2048, eos_ids=(), max_batch=8,
                             attention_call_bytes=0)
    assert engine.by_rows == (model != "tiny-gemma2")
    arriving_apart(plain, tokenizer, engine, monkeypatch)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_through_an_executor_rows_decode_by_runs_as_plain_generate(device: str, client_on,
                                                                   monkeypatch) -> None:
    """The same through an executor process on `device`, the worker's model there too: on a
    GPU the runs' attention (`row_attention.attend`), the rooms' joins and keeps in place and
    the padding read back from the device's mask run there; texts as plain generate()'s on it."""
    tokenizer = AutoTokenizer.from_pretrained(resolve_model("tiny-llama"))
    plain, ours = build_pair("tiny-llama", "lora", client_on(device, f"rows-{device}"),
                             device=device)
    engine = InferenceEngine(ours.eval(), tokenizer, max_context=2048, eos_ids=(), max_batch=8,
                             attention_call_bytes=0)
    assert engine.by_rows
    arriving_apart(plain.to(device), tokenizer, engine, monkeypatch)


def arriving_apart(plain, tokenizer, engine: InferenceEngine, monkeypatch) -> None:
    """Six prompts of other lengths, one every 3 steps: steps whose rows hold padding, rows
    kept and joined in place, and every text `plain`'s generate()'s."""
    in_place = {"keep_in_place": 0, "join_in_place": 0}
    for name in in_place:
        monkeypatch.setattr(RoomyLayer, name, counting(in_place, name))
    greedy = W.SamplingParams(max_tokens=8, temperature=0)
    lengths = (30, 3, 17, 9, 5, 12)  # one every 3 steps; the first leaves after step 6
    requests = [Request(str(n), list(range(n, 2 * n)), greedy) for n in lengths]
    events: dict[str, list] = {r.id: [] for r in requests}
    waiting, planned, step = list(requests), 0, 0
    while waiting or engine.has_work():
        if waiting and step % 3 == 0:
            for event in engine.add(waiting.pop(0)):
                events[event.id].append(event)
        for event in engine.step():
            events[event.id].append(event)
        planned += bool(plan(engine.resident.starts, engine.call_positions))
        step += 1
    assert planned >= 6  # steps whose rows held padding (not the first two, not the last)
    assert in_place["keep_in_place"] and in_place["join_in_place"], in_place
    for request in requests:
        expected = generated(plain, tokenizer, request.prompt_ids, 8)
        assert text(events[request.id]) == expected, request.id

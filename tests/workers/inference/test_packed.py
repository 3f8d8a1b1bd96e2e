"""Prompts' chunks (and short prompts arriving) packed into the running rows' decode forward:
one forward a step, every row's logits and the prompt's as if each ran alone, sliding windows
held, every architecture's tokens plain generate()'s (through an executor on a GPU too), rows of
several adapters packed unless one wraps the head, and a failed packed step taken back with its
chunks gone alone."""

from __future__ import annotations

import copy

import pytest
import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache, MistralConfig

from catalogue.resolve import resolve_model
from executor.local import LocalExecutor
from tests.conftest import TINY_MODELS
from tests.peft_reference import build_pair
from tests.workers.inference.test_chunks import deltas, plain_text, prompt, steps_of, text
from tests.workers.inference.test_row_attention import alone, joined
from wire import manager as W
from workers.inference.chunks import Partial
from workers.inference.engine import InferenceEngine
from workers.inference.packed import Segment, packs, step_forward
from workers.inference.request import Request
from workers.inference.row_attention import install, plan
from workers.inference.rows import RowAdapters

GREEDY = W.SamplingParams(max_tokens=12, temperature=0)


def input_shapes(model) -> list[tuple[int, int]]:
    """The (rows, positions) of every forward of `model` from now on."""
    shapes: list[tuple[int, int]] = []
    model.register_forward_pre_hook(
        lambda _, args, kw: shapes.append(tuple(kw["input_ids"].shape)), with_kwargs=True)
    return shapes


def chunking(model: str = "tiny-llama", pack: bool = True, client=None, device: str = "cpu"):
    """`model` with a LoRA adapter, plain and ours (over `client`, else an in-process executor)
    on `device`, its tokenizer, and an engine of ours that takes prompts 16 tokens a step."""
    tokenizer = AutoTokenizer.from_pretrained(resolve_model(model))
    plain, ours = build_pair(model, "lora", client or LocalExecutor.load(model), device=device)
    engine = InferenceEngine(ours.eval(), tokenizer, max_context=1024, eos_ids=(),
                             chunk_tokens=16, pack=pack)
    return plain.to(device).eval(), tokenizer, engine


@pytest.mark.parametrize("model", TINY_MODELS)
def test_a_chunk_shares_the_running_rows_forward_on_every_architecture(model: str) -> None:
    """70 prompt tokens at 16 a step beside a running request: where attention goes by rows,
    each step is one forward of the running row's token and the chunk's (1 + 16 positions), the
    prompt's first token comes in the step its last chunk is in and its next with the running
    row's; gemma2 (eager attention) keeps a forward each. Both texts are plain generate()'s."""
    plain, tokenizer, engine = chunking(model)
    assert engine.by_rows == (model != "tiny-gemma2")
    chunk_beside_a_running_row(plain, tokenizer, engine)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_through_an_executor_a_chunk_shares_the_running_rows_forward(device: str,
                                                                     client_on) -> None:
    """The same through an executor process on `device`, the worker's model there too: on a
    GPU the packed step's forward (`step_forward`: the rows' masks and positions,
    `Packed.attend`, `PackedCache.update`), row attention and the rooms' joins in place run on
    the device; both texts are plain generate()'s on it."""
    plain, tokenizer, engine = chunking(client=client_on(device, f"packed-{device}"),
                                        device=device)
    assert engine.by_rows
    chunk_beside_a_running_row(plain, tokenizer, engine)


def chunk_beside_a_running_row(plain, tokenizer, engine: InferenceEngine) -> None:
    """A 70-token prompt at 16 a step beside a row decoding 20 tokens: its steps' forwards
    (packed where the engine attends by rows), both requests' tokens a step, and their texts
    against `plain`'s generate()."""
    shapes = input_shapes(engine.decode_model)
    running, long = ([t % tokenizer.vocab_size for t in prompt(n, seed)] for n, seed in
                     ((5, 0), (70, 1)))
    engine.add(Request("running", running, W.SamplingParams(max_tokens=20, temperature=0)))
    steps = [engine.step(), engine.step()]
    engine.add(Request("long", long, GREEDY))
    steps += steps_of(engine)
    packed = engine.by_rows
    chunked = [(1, 17)] * 4 + [(1, 7)] if packed else [(1, 16), (1, 1)] * 4 + [(1, 6), (2, 1)]
    assert shapes[3:3 + len(chunked)] == chunked  # after the prefill and two decode steps
    assert deltas(steps, "running")[2:7] == [1] * 5
    assert deltas(steps, "long")[:8] == [0] * 6 + ([1, 1] if packed else [2, 1])
    assert text(steps, "running") == plain_text(plain, tokenizer, running, 20)
    assert text(steps, "long") == plain_text(plain, tokenizer, long, 12)


def test_an_engine_told_not_to_pack_gives_each_prompt_forwards_of_its_own() -> None:
    """`pack=False` (bench 15's comparison): a 40-token prompt's chunks and a short prompt
    arriving beside the running row each have a forward of their own; tokens unchanged."""
    plain, tokenizer, engine = chunking(pack=False)
    shapes = input_shapes(engine.decode_model)
    prompts = {"running": prompt(5), "long": prompt(40, seed=1), "short": prompt(6, seed=2)}
    engine.add(Request("running", prompts["running"], W.SamplingParams(max_tokens=20,
                                                                        temperature=0)))
    steps = [engine.step()]
    engine.add(Request("long", prompts["long"], GREEDY))
    steps += [engine.step() for _ in range(3)]
    engine.add(Request("short", prompts["short"], GREEDY))
    steps += steps_of(engine)
    assert [s for s in shapes if s[1] > 1] == [(1, 5), (1, 16), (1, 16), (1, 8), (1, 6)]
    for rid, ids in prompts.items():
        tokens = 20 if rid == "running" else GREEDY.max_tokens
        assert text(steps, rid) == plain_text(plain, tokenizer, ids, tokens), rid


@pytest.fixture(scope="module")
def tiny_llama():
    model = AutoModelForCausalLM.from_pretrained(resolve_model("tiny-llama")).eval()
    assert install(model)
    return model


class Row:  # what step_forward reads of a running sequence
    def __init__(self, last: int) -> None:
        self.last = last
        self.request = Request("row", [], GREEDY)


def test_a_packed_steps_logits_are_each_rows_and_the_prompts_alone(tiny_llama) -> None:
    """Rows of 3 and 40 tokens (padding poisoned with NaN) and a 20-token prompt in chunks of
    8 and 12: each step's row logits are each row's alone in plain transformers, the prompt's
    last logits and its cache those of the whole prompt in one forward."""
    prompts, long = [list(range(5, 8)), list(range(100, 140))], list(range(200, 220))
    batch = joined(tiny_llama, prompts)
    with torch.no_grad():
        whole = DynamicCache()
        expected = tiny_llama(input_ids=torch.tensor([long]), past_key_values=whole,
                              use_cache=True).logits[0, -1]
    for layer in batch.cache.layers:
        layer.keys[0, :, :37] = layer.values[0, :, :37] = float("nan")
    batch.sequences = [Row(1), Row(2)]
    partial = Partial(Request("long", long, GREEDY))
    for step, take in enumerate((8, 12)):
        groups = plan(batch.starts, 0)
        with torch.no_grad():
            logits, (done,) = step_forward(tiny_llama, RowAdapters(), batch, groups,
                                           [(partial, take)], torch.device("cpu"))
        assert (done is None) == (step == 0)
        for row, ids in enumerate(prompts):  # row r's token is r + 1 every step
            torch.testing.assert_close(logits[row], alone(tiny_llama, ids + [row + 1] * step,
                                                          row + 1))
    torch.testing.assert_close(done.last_logits, expected)
    for (keys, values), layer in zip(done.kv, whole.layers, strict=True):
        torch.testing.assert_close(keys, layer.keys)
        torch.testing.assert_close(values, layer.values)


def sliding_mistral(window: int):
    config = MistralConfig(vocab_size=32000, hidden_size=32, intermediate_size=64,
                           num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                           sliding_window=window, max_position_embeddings=256)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").eval()


def recomputed(model, ids: list[int], tokens: int) -> list[int]:
    """Greedy tokens, each from a forward over the whole sequence so far (no cache: here
    generate()'s sliding-window cache drifts from it, on prompts of 5 and of 40 tokens)."""
    sequence = list(ids)
    with torch.no_grad():
        for _ in range(tokens):
            sequence.append(int(model(input_ids=torch.tensor([sequence])).logits[0, -1].argmax()))
    return sequence[len(ids):]


def test_sliding_windows_hold_in_a_packed_step() -> None:
    """A window of 8 positions, a 40-token prompt in chunks of 16 beside rows of 5 and 20
    tokens: every request's tokens are those of the model over each whole sequence."""
    model = sliding_mistral(8)
    tokenizer = AutoTokenizer.from_pretrained(resolve_model("tiny-mistral"))
    engine = InferenceEngine(model, tokenizer, max_context=256, eos_ids=(), chunk_tokens=16)
    shapes = input_shapes(engine.decode_model)
    requests = {"a": prompt(5), "b": prompt(20, seed=2), "long": prompt(40, seed=1)}
    for rid in ("a", "b"):
        engine.add(Request(rid, requests[rid], W.SamplingParams(max_tokens=30, temperature=0)))
    steps = [engine.step()]
    engine.add(Request("long", requests["long"], GREEDY))
    steps += steps_of(engine)
    packed = [shape for shape in shapes if shape[0] == 1 and shape[1] > 2]
    assert packed[-3:] == [(1, 18), (1, 18), (1, 10)]  # two rows' tokens, chunks 16, 16, 8
    for rid, ids in requests.items():
        expected = recomputed(model, ids, GREEDY.max_tokens if rid == "long" else 30)
        assert text(steps, rid) == tokenizer.decode(expected, skip_special_tokens=True), rid


@pytest.mark.parametrize("device", ["in-process", "cpu", pytest.param("cuda",
                                                                     marks=pytest.mark.gpu)])
def test_a_packed_step_that_fails_is_taken_back_and_its_chunks_go_alone(device, client_on,
                                                                        monkeypatch) -> None:
    """The first and the second chunk's attention raise in the first layer, after that layer's
    keys and values were appended to the batch's cache and the prompt's (new, then one chunk
    in): each step is taken back, the chunk goes in a forward of its own and the rows decode
    after it, and every request's tokens are still plain generate()'s. In-process, and through
    an executor process on `device` (on a GPU: the caches taken back there, `undo_step`)."""
    plain, tokenizer, engine = chunking() if device == "in-process" else \
        chunking(client=client_on(device, f"failing-{device}"), device=device)
    shapes = input_shapes(engine.decode_model)
    mask, failed = Segment.mask, []

    def failing(self: Segment, *args):
        if self.done in (0, 16) and self.done not in failed:
            failed.append(self.done)
            raise RuntimeError("injected")
        return mask(self, *args)

    monkeypatch.setattr(Segment, "mask", failing)
    running, long = prompt(5), prompt(40, seed=1)
    engine.add(Request("running", running, W.SamplingParams(max_tokens=20, temperature=0)))
    steps = [engine.step()]
    engine.add(Request("long", long, GREEDY))
    steps += steps_of(engine)
    assert failed == [0, 16]
    assert [s for s in shapes if s[1] > 2] == [(1, 5), *[(1, 17), (1, 16)] * 2, (1, 9)]
    assert deltas(steps, "running")[1:4] == [1, 1, 1]  # a token in the failed steps too
    assert not any(isinstance(e, W.Failed) for step in steps for e in step)
    assert text(steps, "running") == plain_text(plain, tokenizer, running, 20)
    assert text(steps, "long") == plain_text(plain, tokenizer, long, 12)


def test_short_prompts_arriving_beside_running_rows_ride_in_their_forward() -> None:
    """Prompts of 5 and 6 tokens arriving together while a row decodes: one forward for the
    row's token and both prompts (16 tokens a step), each prompt's first token in that step;
    a 30-token prompt after them comes in by chunks beside the three rows. Every request's
    tokens are plain generate()'s."""
    plain, tokenizer, engine = chunking()
    shapes = input_shapes(engine.decode_model)
    prompts = {"running": prompt(5), "a": prompt(5, seed=3), "b": prompt(6, seed=4),
               "c": prompt(30, seed=5)}
    engine.add(Request("running", prompts["running"], W.SamplingParams(max_tokens=20,
                                                                        temperature=0)))
    steps = [engine.step()]
    for rid in ("a", "b"):
        engine.add(Request(rid, prompts[rid], GREEDY))
    steps.append(engine.step())
    engine.add(Request("c", prompts["c"], GREEDY))
    steps += steps_of(engine)
    assert [s for s in shapes if s[1] > 1] == [(1, 5), (1, 1 + 5 + 6), (1, 3 + 16), (1, 3 + 14)]
    assert [deltas(steps, rid)[1] for rid in ("running", "a", "b")] == [1, 1, 1]
    for rid, ids in prompts.items():
        tokens = 20 if rid == "running" else GREEDY.max_tokens
        assert text(steps, rid) == plain_text(plain, tokenizer, ids, tokens), rid


def test_rows_of_several_adapters_pack_unless_an_adapter_wraps_the_head() -> None:
    """The head sees only the positions whose logits are kept, not every row's: rows of several
    adapters (the base model's among them) pack where no adapter's module wraps it; rows of
    one adapter, made the active one, always."""
    base = AutoModelForCausalLM.from_pretrained(resolve_model("tiny-llama"))
    for targets, wrapped in ((["q_proj", "v_proj"], False), (["q_proj", "lm_head"], True)):
        model = get_peft_model(copy.deepcopy(base), LoraConfig(r=4, target_modules=targets))
        rows = RowAdapters(model)
        assert rows.tunes_head() == wrapped
        running = [Row(1)]  # of the base model
        assert packs(Request("long", [], GREEDY, adapter="default"), running, rows) != wrapped
        running[0].request = Request("row", [], GREEDY, adapter="default")
        assert packs(Request("long", [], GREEDY, adapter="default"), running, rows)
        assert not packs(Request("long", [], GREEDY, adapter="default"), [], rows)

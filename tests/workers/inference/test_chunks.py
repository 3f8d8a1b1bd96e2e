"""Chunked prefill: a long prompt comes in a chunk a step beside running sequences, which keep
decoding between its chunks, and every request's tokens are plain generate()'s."""

from __future__ import annotations

from collections import deque

import pytest
import torch
from transformers import AutoTokenizer

from catalogue.resolve import resolve_model
from executor.local import LocalExecutor
from tests.peft_reference import build_pair
from wire import manager as W
from workers.inference.chunks import (
    AMORTIZED,
    LEARN_TOKENS,
    MIN_TOKENS,
    UNMEASURED_TOKENS,
    ChunkBudget,
    Chunker,
)
from workers.inference.engine import InferenceEngine
from workers.inference.request import Request

MODEL = "tiny-llama"
GREEDY = W.SamplingParams(max_tokens=12, temperature=0)


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(resolve_model(MODEL))


def prompt(n: int, seed: int = 0) -> list[int]:
    return torch.randint(3, 30000, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def plain_text(plain, tokenizer, ids: list[int], tokens: int) -> str:
    with torch.no_grad():
        t = torch.tensor([ids], device=plain.device)
        out = plain.generate(input_ids=t, attention_mask=torch.ones_like(t), do_sample=False,
                             max_new_tokens=tokens, min_new_tokens=tokens)
    return tokenizer.decode(out[0, t.shape[1]:], skip_special_tokens=True)


def steps_of(engine: InferenceEngine) -> list[list[W.Message]]:
    steps = []
    while engine.has_work():
        steps.append(engine.step())
    return steps


def deltas(steps: list[list[W.Message]], rid: str) -> list[int]:
    """How many of `rid`'s tokens came in each step."""
    return [sum(isinstance(e, W.Delta) and e.id == rid for e in step) for step in steps]


def text(steps: list[list[W.Message]], rid: str) -> str:
    return "".join(e.text for step in steps for e in step if isinstance(e, W.Delta) and e.id == rid)


@pytest.mark.parametrize("method", ["lora", "ia3", "adalora", "prompt_tuning"])
def test_a_long_prompt_comes_in_by_chunks_while_a_running_one_decodes(method, tokenizer) -> None:
    """70 prompt tokens at 16 a step: five chunks (16 x 4 + 6), each in a step in which the
    running request gets a token (in the same forward: test_packed.py); both texts plain
    generate()'s. Prompt tuning's virtual tokens go in front of each forward, so its prompt
    comes in whole."""
    plain, ours = build_pair(MODEL, method, LocalExecutor.load(MODEL))
    plain.eval()
    engine = InferenceEngine(ours.eval(), tokenizer, max_context=2048, eos_ids=(),
                             chunk_tokens=16)
    forwards = []  # positions of each forward (prompt tuning's decode steps: embeddings)
    engine.decode_model.register_forward_pre_hook(
        lambda _, args, kw: forwards.append(kw.get("input_ids", ids).shape[1]), with_kwargs=True)
    ids = torch.zeros(1, 1)
    whole_forwards = []  # prompt tuning's prefills (its decode steps' inputs are embeddings)
    ours.register_forward_pre_hook(
        lambda _, args, kw: whole_forwards.append(kw["input_ids"].shape[1]), with_kwargs=True)
    running, long = prompt(5), prompt(70, seed=1)
    engine.add(Request("running", running, W.SamplingParams(max_tokens=20, temperature=0)))
    first = [engine.step(), engine.step()]
    engine.add(Request("long", long, GREEDY))
    steps = first + steps_of(engine)
    whole = ours.active_peft_config.is_prompt_learning
    if whole:
        assert whole_forwards == [5, 70]
    else:
        # each step the running row's token and a chunk in one forward
        assert [n for n in forwards if n > len(running)] == [17, 17, 17, 17, 7]
    chunked_steps = 1 if whole else 5
    assert deltas(steps, "running")[2:2 + chunked_steps] == [1] * chunked_steps
    assert deltas(steps, "long")[:2 + chunked_steps] == [0] * (1 + chunked_steps) + \
        [2 if whole else 1]
    assert text(steps, "running") == plain_text(plain, tokenizer, running, 20)
    assert text(steps, "long") == plain_text(plain, tokenizer, long, 12)
    assert not engine.chunks.partials and not engine.running


def test_prompts_asking_their_logprobs_and_nothing_running_go_whole(tokenizer) -> None:
    _, ours = build_pair(MODEL, "lora", LocalExecutor.load(MODEL))
    engine = InferenceEngine(ours.eval(), tokenizer, max_context=2048, eos_ids=(),
                             chunk_tokens=16)
    forwards = []
    ours.register_forward_pre_hook(lambda _, args, kw: forwards.append(kw["input_ids"].shape[1]),
                                   with_kwargs=True)
    engine.add(Request("alone", prompt(40), GREEDY))  # nothing else runs: no one to let through
    engine.step()
    engine.add(Request("echo", prompt(40, seed=2),
                       W.SamplingParams(max_tokens=2, echo=True, logprobs=1)))
    steps = steps_of(engine)
    assert forwards == [40, 40]
    started = [e for step in steps for e in step if isinstance(e, W.Started)]
    assert len(started[0].prompt_logprobs) == 40


def test_a_partial_holds_its_seats_and_can_be_aborted(tokenizer) -> None:
    _, ours = build_pair(MODEL, "lora", LocalExecutor.load(MODEL))
    engine = InferenceEngine(ours.eval(), tokenizer, max_context=2048, eos_ids=(),
                             max_batch=3, chunk_tokens=16)
    engine.add(Request("running", prompt(5), W.SamplingParams(max_tokens=30, temperature=0)))
    engine.step()
    engine.add(Request("long", prompt(80, seed=1), W.SamplingParams(max_tokens=4, n=2)))
    engine.add(Request("third", prompt(4, seed=3), GREEDY))
    engine.step()
    assert [p.request.id for p in engine.chunks.partials] == ["long"]
    assert [r.id for r in engine.waiting] == ["third"]  # 1 running + 2 held by "long" = 3
    engine.abort({"long"})
    events = engine.step()
    assert not engine.chunks.partials and not engine.waiting
    assert {e.id for e in events} == {"running", "third"}
    assert "long" not in {e.id for step in steps_of(engine) for e in step}


def test_a_chunk_that_fails_fails_its_request_only(tokenizer) -> None:
    plain, ours = build_pair(MODEL, "lora", LocalExecutor.load(MODEL))
    plain.eval()
    engine = InferenceEngine(ours.eval(), tokenizer, max_context=2048, eos_ids=(),
                             chunk_tokens=16)
    prefill, poison = engine.prefill_model, 2  # a forward with this token raises (a bug)

    def faulty(input_ids, **kw):
        if (input_ids == poison).any():
            raise RuntimeError("injected")
        return prefill(input_ids=input_ids, **kw)

    engine.prefill_model = faulty
    decode = engine.decode_model  # where a chunk goes packed with the running row's token

    def faulty_decode(input_ids, **kw):
        if (input_ids == poison).any():
            raise RuntimeError("injected")
        return decode(input_ids=input_ids, **kw)

    engine.decode_model = faulty_decode
    running = prompt(5)
    engine.add(Request("running", running, GREEDY))
    first = engine.step()
    engine.add(Request("poisoned", [*prompt(20, seed=4), poison, *prompt(20, seed=5)], GREEDY))
    steps = [first, *steps_of(engine)]
    failed = [e for step in steps for e in step if e.id == "poisoned"]
    assert len(failed) == 1 and isinstance(failed[0], W.Failed) and failed[0].status == 500
    assert text(steps, "running") == plain_text(plain, tokenizer, running, 12)  # it went on
    assert not engine.chunks.partials and not engine._pending
    failed = engine.fail_all(503, "executor_unavailable", "down")
    assert failed == []


def test_every_partial_fails_with_the_executor(tokenizer) -> None:
    _, ours = build_pair(MODEL, "lora", LocalExecutor.load(MODEL))
    engine = InferenceEngine(ours.eval(), tokenizer, max_context=2048, eos_ids=(),
                             chunk_tokens=16)
    engine.add(Request("running", prompt(5), GREEDY))
    engine.step()
    engine.add(Request("long", prompt(60, seed=1), GREEDY))
    engine.step()
    failed = engine.fail_all(503, "executor_unavailable", "down")
    assert sorted(f.id for f in failed) == ["long", "running"]
    assert not engine.has_work()


def test_the_budget_follows_what_the_engine_measures() -> None:
    """A decode step's time, and a prompt token's beyond it from a prefill forward long enough
    to say: the budget is then AMORTIZED decode steps' worth of tokens. (Gemma2, whose chunks
    have forwards of their own: tiny-llama's 256 tokens packed into a decode step cost less
    than that step, too little to tell a token's cost by.)"""
    _, ours = build_pair("tiny-gemma2", "lora", LocalExecutor.load("tiny-gemma2"))
    tokenizer = AutoTokenizer.from_pretrained(resolve_model("tiny-gemma2"))
    engine = InferenceEngine(ours.eval(), tokenizer, max_context=2048, eos_ids=())
    assert not engine.by_rows
    budget = engine.chunks.budget
    assert budget.tokens() == UNMEASURED_TOKENS  # nothing measured yet
    engine.add(Request("a", prompt(5), GREEDY))
    steps_of(engine)
    assert budget.decode_s > 0 and budget.token_s == 0  # 5 tokens say nothing of a token
    engine.add(Request("b", prompt(5), W.SamplingParams(max_tokens=40, temperature=0)))
    engine.step()
    assert budget.token_s == 0  # nor beside a decode step measured
    engine.add(Request("echo", prompt(1500, seed=2), W.SamplingParams(max_tokens=1, echo=True,
                                                                     logprobs=0)))
    engine.step()  # whole, with every position's logits: it says nothing of a prompt token
    assert budget.token_s == 0
    engine.add(Request("long", prompt(1500, seed=1), GREEDY))
    steps_of(engine)
    assert budget.token_s > 0
    assert budget.tokens() == max(MIN_TOKENS, int(AMORTIZED * budget.decode_s / budget.token_s))


def test_a_chunk_costs_amortized_decode_steps_or_what_a_target_leaves() -> None:
    budget = ChunkBudget()
    budget.observe_prefill(1.0, 100)  # no decode step measured yet: nothing to set it against
    budget.observe_decode(0.010)
    budget.observe_prefill(0.015, 100)  # under two decode steps: too short to say
    budget.observe_prefill(1.0, LEARN_TOKENS - 1)  # too few tokens to tell from the fixed part
    assert budget.tokens() == UNMEASURED_TOKENS
    assert budget.tokens(inter_token_us=100_000) == MIN_TOKENS  # a target nothing can check
    budget.observe_prefill(0.110, 100)  # 10 ms fixed, 1 ms a token
    assert budget.token_s == pytest.approx(0.001)
    assert budget.tokens() == 30  # 3 decode steps' worth
    assert budget.tokens(inter_token_us=100_000) == 30  # a loose target: the same
    assert budget.tokens(inter_token_us=40_000) == 20  # 40 ms less a decode step and a chunk's
    assert budget.tokens(inter_token_us=40_000, packed=True) == 30  # in the step's forward
    assert budget.tokens(inter_token_us=35_000, packed=True) == 25
    assert budget.tokens(inter_token_us=20_000) == MIN_TOKENS  # missed anyway: keep coming in
    budget.observe_decode(0.050)  # moves a quarter of the way
    assert budget.decode_s == pytest.approx(0.020)
    assert ChunkBudget(fixed=7).tokens() == 7


def test_a_chunk_is_sized_by_a_tokens_cost_on_the_fewest_threads_measured(threads_back) -> None:
    """A long prompt's whole prefill runs on more threads than a chunk step may get
    (`workers.threads`): its cheaper tokens size no chunk while a cost on fewer is known."""
    budget = ChunkBudget()
    budget.observe_decode(0.010)
    budget.observe_prefill(0.060, 100, threads=2)  # 0.5 ms a token on two threads
    assert budget.tokens() == 60  # nothing measured on fewer
    budget.observe_prefill(0.110, 100, threads=1)  # 1 ms a token on one
    budget.observe_prefill(0.030, 100, threads=4)
    assert budget.token_costs == pytest.approx({1: 0.001, 2: 0.0005, 4: 0.0002})
    assert budget.tokens() == 30
    torch.set_num_threads(1)  # by default, the threads the forward just ran on
    budget.observe_prefill(0.210, 100)  # a quarter of the way to 2 ms
    assert budget.token_costs[1] == pytest.approx(0.00125) and budget.tokens() == 24


def test_a_steps_chunks_go_first_come_first_within_the_budget() -> None:
    chunker = Chunker()
    chunker.budget.observe_decode(0.010)
    chunker.budget.observe_prefill(0.110, 100)  # 30 tokens a chunk
    targeted = W.TokenTargets(inter_token_us=40_000)  # 20 tokens a chunk
    running = [Request("r", [1], GREEDY), Request("t", [1], GREEDY, token_targets=targeted)]
    admitted = deque([Request("a", [1] * 50, GREEDY), Request("short", [1] * 20, GREEDY),
                      Request("b", [1] * 90, GREEDY),
                      Request("echo", [1] * 90, W.SamplingParams(echo=True))])
    chunks = chunker.plan(admitted, running[:1])
    assert [r.id for r in admitted] == ["short", "echo"]  # these go whole
    assert [(p.request.id, n) for p, n in chunks] == [("a", 30)]
    chunks[0][0].done = 40
    chunks = chunker.plan(deque(), running)
    assert [(p.request.id, n) for p, n in chunks] == [("a", 10), ("b", 10)]
    assert chunker.plan(deque(), []) and not Chunker().plan(deque(), [])


def test_short_prompts_come_in_whole_in_what_a_packed_step_leaves() -> None:
    """Where the step packs its chunks into the rows' forward, admitted prompts that fit in
    what the partials left of the budget come in as chunks too, first come first."""
    chunker = Chunker()
    chunker.budget.observe_decode(0.010)
    chunker.budget.observe_prefill(0.110, 100)  # 30 tokens a step
    running = [Request("r", [1], GREEDY)]
    echo = Request("echo", [1] * 5, W.SamplingParams(echo=True))
    admitted = deque([echo, Request("a", [1] * 12, GREEDY), Request("b", [1] * 10, GREEDY),
                      Request("c", [1] * 9, GREEDY), Request("d", [1] * 5, GREEDY)])
    chunks = chunker.plan(admitted, running, packs=True)
    assert [(p.request.id, n) for p, n in chunks] == [("a", 12), ("b", 10)]  # c: 8 left
    assert [r.id for r in admitted] == ["echo", "c", "d"]  # prefilled as before
    assert not Chunker().plan(deque([Request("e", [1] * 5, GREEDY)]), running) and \
        not Chunker().plan(deque([Request("e", [1] * 5, GREEDY)]), [], packs=True)


@pytest.mark.parametrize("model", ["tiny-gpt2", "tiny-gemma2", "tiny-starcoder"])
def test_chunks_equal_plain_generate_for_every_architecture(model: str) -> None:
    tokenizer = AutoTokenizer.from_pretrained(resolve_model(model))
    plain, ours = build_pair(model, "lora", LocalExecutor.load(model))
    plain.eval()
    engine = InferenceEngine(ours.eval(), tokenizer, max_context=1024, eos_ids=(),
                             chunk_tokens=16)
    running, long = ([t % tokenizer.vocab_size for t in prompt(n, seed)] for n, seed in
                     ((5, 0), (70, 1)))
    engine.add(Request("running", running, W.SamplingParams(max_tokens=20, temperature=0)))
    first = engine.step()
    engine.add(Request("long", long, GREEDY))
    steps = [first, *steps_of(engine)]
    assert deltas(steps, "running")[1:6] == [1] * 5  # one a step while the prompt came in
    assert deltas(steps, "long")[:6] == [0] * 5 + [1 if engine.by_rows else 2]  # 16 x 4 + 6
    assert text(steps, "running") == plain_text(plain, tokenizer, running, 20)
    assert text(steps, "long") == plain_text(plain, tokenizer, long, 12)

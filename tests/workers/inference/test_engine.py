"""The inference engine (in-process executor): continuous batching equals plain generate()."""

from __future__ import annotations

from contextlib import nullcontext

import pytest
import torch
from transformers import AutoTokenizer

from catalogue.resolve import resolve_model
from executor.local import LocalExecutor
from tests.conftest import TINY_MODELS
from tests.peft_reference import METHODS, build_pair
from wire import manager as W
from wire.call import messages as P
from workers.inference.engine import InferenceEngine
from workers.inference.pacing import Pacer
from workers.inference.request import Request
from workers.remote.handle import ExecutorUnavailable

MODEL = "tiny-llama"


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(resolve_model(MODEL))


def prompts() -> list[list[int]]:
    return [torch.randint(0, 50000, (n,), generator=torch.Generator().manual_seed(n)).tolist()
            for n in (5, 9, 3, 12)]


def run(engine: InferenceEngine, requests: list[Request], stagger: int = 2) -> dict[str, list]:
    """Add request k after k * stagger steps; collect every event by request id."""
    events: dict[str, list] = {r.id: [] for r in requests}
    step = added = 0
    while added < len(requests) or engine.has_work():
        while added < len(requests) and step >= added * stagger:
            for event in engine.add(requests[added]):
                events[event.id].append(event)
            added += 1
        for event in engine.step():
            events[event.id].append(event)
        step += 1
    return events


def text(events: list, index: int = 0) -> str:
    return "".join(e.text for e in events if isinstance(e, W.Delta) and e.index == index)


def generated(plain, tokenizer, prompt: list[int], tokens: int) -> str:
    """The text plain generate() gives after `prompt`, greedy, exactly `tokens` tokens."""
    ids = torch.tensor([prompt], device=plain.device)
    with torch.no_grad():
        out = plain.eval().generate(input_ids=ids, max_new_tokens=tokens, min_new_tokens=tokens,
                                    do_sample=False, attention_mask=torch.ones_like(ids))
    return tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True)


@pytest.mark.parametrize("stagger", [2, 0], ids=["staggered", "together"])
@pytest.mark.parametrize("method", METHODS)
def test_requests_equal_plain_generate(method: str, stagger: int, tokenizer) -> None:
    """Arriving apart, the first prompt is prefilled alone and each later one rides in the
    running rows' decode forward (test_packed.py); arriving together, prompts of similar
    lengths share a left-padded forward (12 with 9 tokens, 5 with 3); not through virtual
    tokens, each alone."""
    plain, ours = build_pair(MODEL, method, LocalExecutor.load(MODEL))
    plain.eval()
    engine = InferenceEngine(ours.eval(), tokenizer, max_context=2048, eos_ids=(), max_batch=8)
    forwards = []  # the prefills' shapes (decode steps run through the model under the PEFT one)
    ours.register_forward_pre_hook(lambda _, args, kw: forwards.append(kw["input_ids"].shape),
                                   with_kwargs=True)
    greedy = W.SamplingParams(max_tokens=10, temperature=0)
    requests = [Request(str(i), p, greedy) for i, p in enumerate(prompts())]
    events = run(engine, requests, stagger)
    virtual = ours.active_peft_config.is_prompt_learning
    alone = prompts()[:1] if stagger and not virtual else prompts()
    assert forwards == ([(2, 12), (2, 5)] if not (stagger or virtual) else
                        [(1, len(p)) for p in alone])
    for request in requests:
        expected = generated(plain, tokenizer, request.prompt_ids, 10)
        assert text(events[request.id]) == expected, (method, request.id)
        done = [e for e in events[request.id] if isinstance(e, W.Done)]
        assert done and done[0].completion_tokens == 10
    assert not engine.running and engine.resident.rows == engine.offloaded.rows == 0


def test_a_new_requests_first_token_is_emitted_before_the_steps_decode(tokenizer) -> None:
    """A step's prefill events go to `emit` before its decode step runs: a request admitted
    with nothing running has its Started and first token emitted while the step's decode (its
    second token) has yet to come; the tokens are plain generate()'s."""
    plain, ours = build_pair(MODEL, "lora", LocalExecutor.load(MODEL))
    engine = InferenceEngine(ours.eval(), tokenizer, max_context=2048, eos_ids=())
    engine.add(Request("r", prompts()[1], W.SamplingParams(max_tokens=4, temperature=0)))
    decoded, emitted = [], []
    engine.decode_model.register_forward_pre_hook(lambda *_: decoded.append(len(emitted)))
    returned = engine.step(emit=emitted.extend)
    assert [type(e) for e in emitted] == [W.Started, W.Delta]
    assert decoded == [0, 2]  # the prompt's forward (under the adapter's), then the decode's
    assert [type(e) for e in returned] == [W.Delta]  # the second token, from the decode
    events = emitted + returned
    while engine.has_work():
        events += engine.step(emit=events.extend)
    assert text(events) == generated(plain, tokenizer, prompts()[1], 4)
    assert [e.completion_tokens for e in events if isinstance(e, W.Done)] == [4]


def test_seeded_sampling_is_reproducible_and_n_sequences_differ(tokenizer) -> None:
    _, ours = build_pair(MODEL, "lora", LocalExecutor.load(MODEL))
    engine = InferenceEngine(ours.eval(), tokenizer, max_context=2048, eos_ids=())

    def sample(seed: int) -> list[str]:
        params = W.SamplingParams(max_tokens=8, temperature=1.0, top_p=0.9, top_k=50, n=3,
                                  seed=seed)
        events = run(engine, [Request("r", prompts()[0], params)])["r"]
        return [text(events, i) for i in range(3)]

    assert sample(1) == sample(1)
    assert sample(1) != sample(2)
    assert len(set(sample(1))) == 3


def test_n_up_to_the_batch_runs_and_one_more_is_refused(tokenizer) -> None:
    """A worker decodes at most its batch of sequences at once: a prompt's n (or best_of) up to
    it gets that many, each what plain generate() gives (greedy: all alike); one more would wait
    forever for seats, so it is a 400 naming n."""
    plain, ours = build_pair(MODEL, "lora", LocalExecutor.load(MODEL))
    engine = InferenceEngine(ours.eval(), tokenizer, max_context=2048, eos_ids=(), max_batch=4)
    refused = engine.add(Request("five", prompts()[0], W.SamplingParams(max_tokens=6, n=5)))
    assert isinstance(refused[0], W.Failed) and (refused[0].status, refused[0].code) == \
        (400, "invalid_n")
    assert "5 sequences" in refused[0].message and "(4)" in refused[0].message
    params = W.SamplingParams(max_tokens=6, temperature=0, n=4)
    events = run(engine, [Request("four", prompts()[0], params)])["four"]
    expected = generated(plain, tokenizer, prompts()[0], 6)
    assert [text(events, i) for i in range(4)] == [expected] * 4


def test_abort_and_context_limit(tokenizer) -> None:
    _, ours = build_pair(MODEL, "lora", LocalExecutor.load(MODEL))
    engine = InferenceEngine(ours.eval(), tokenizer, max_context=20, eos_ids=())
    refused = engine.add(Request("big", prompts()[3], W.SamplingParams(max_tokens=9)))
    assert isinstance(refused[0], W.Failed) and refused[0].status == 400
    assert refused[0].code == "context_length_exceeded"
    engine.add(Request("a", prompts()[0], W.SamplingParams(max_tokens=10, temperature=0)))
    engine.add(Request("b", prompts()[1], W.SamplingParams(max_tokens=10, temperature=0)))
    engine.step()
    engine.abort({"a"})
    rest = []
    while engine.has_work():
        rest += engine.step()
    assert {e.id for e in rest} == {"b"}


def test_a_prefill_that_fails_is_reported_not_lost(tokenizer) -> None:
    class Down(LocalExecutor):
        def call(self, *args, **kwargs):
            raise ExecutorUnavailable("down for the test")

    executor = LocalExecutor.load(MODEL)
    _, ours = build_pair(MODEL, "lora", executor)
    engine = InferenceEngine(ours.eval(), tokenizer, max_context=2048, eos_ids=())
    executor.__class__ = Down
    engine.add(Request("lost?", prompts()[0], W.SamplingParams(max_tokens=4)))
    with pytest.raises(ExecutorUnavailable):
        engine.step()
    failed = engine.fail_all(503, "executor_unavailable", "down")
    assert [(f.id, f.status) for f in failed] == [("lost?", 503)]


def test_a_steps_calls_carry_the_tightest_targets_of_its_requests(tokenizer) -> None:
    """What the worker's client would send with each executor call (`pace` sets it per step):
    while a request that asks for tighter targets runs beside one that asks for none, its;
    after it finished, none again."""
    carried: list[P.CallTargets] = []
    now = [P.NO_TARGETS]

    class Recording(LocalExecutor):
        def call(self, *args, **kwargs):
            carried.append(now[0])
            return super().call(*args, **kwargs)

    executor = LocalExecutor.load(MODEL)
    executor.__class__ = Recording
    _, ours = build_pair(MODEL, "lora", executor)
    pacer = Pacer(lambda targets: now.__setitem__(0, targets), lambda: len(carried),
                  lambda: P.CallTargets(1000, 50_000))
    engine = InferenceEngine(ours.eval(), tokenizer, max_context=2048, eos_ids=(),
                             pace=pacer.pace)
    tight = P.CallTargets(decode_us=300, prefill_us=20_000)
    engine.add(Request("plain", prompts()[0], W.SamplingParams(max_tokens=8, temperature=0)))
    engine.step()
    assert set(carried) == {P.NO_TARGETS}
    carried.clear()
    engine.add(Request("tight", prompts()[1], W.SamplingParams(max_tokens=2, temperature=0),
                       targets=tight))
    engine.add(Request("loose", prompts()[2], W.SamplingParams(max_tokens=2, temperature=0),
                       targets=P.CallTargets(decode_us=900)))
    engine.step()  # their prefills and everyone's decode step
    assert carried and set(carried) == {tight}
    while engine.has_work():
        carried.clear()
        engine.step()
    assert set(carried) == {P.NO_TARGETS}  # "plain" alone decodes on


def test_one_bad_request_fails_alone(tokenizer) -> None:
    _, ours = build_pair(MODEL, "lora", LocalExecutor.load(MODEL))
    ours.eval()
    greedy = W.SamplingParams(max_tokens=6, temperature=0)
    good = prompts()[1]
    solo = run(InferenceEngine(ours, tokenizer, max_context=2048, eos_ids=()),
               [Request("alone", good, greedy)])["alone"]

    engine = InferenceEngine(ours, tokenizer, max_context=2048, eos_ids=())
    prefill = engine.prefill_model
    poison = 7  # a prefill with a prompt of this token raises (an injected bug): the forward
    # of the requests admitted together fails, then each alone, and only the poisoned one

    def faulty(input_ids, **kw):
        if (input_ids == poison).any():
            raise RuntimeError("injected")
        return prefill(input_ids=input_ids, **kw)

    engine.prefill_model = faulty
    shared = []
    engine.rows.select = lambda adapters: shared.append(len(adapters)) or nullcontext()
    events = run(engine, [Request("good", good, greedy),
                          Request("huge-id", [5, 99_999_999], greedy),
                          Request("negative", [-1, 5], greedy),
                          Request("poisoned", [poison, *good[1:]], greedy),
                          Request("also-good", good, greedy)], stagger=0)
    for rid in ("huge-id", "negative"):
        (failed,) = events[rid]
        assert isinstance(failed, W.Failed) and failed.status == 400
        assert "out of range" in failed.message
    (failed,) = events["poisoned"]
    assert isinstance(failed, W.Failed) and failed.status == 500
    assert shared[:4] == [3, 1, 1, 1]  # the three together failed, then one by one
    for rid in ("good", "also-good"):
        assert text(events[rid]) == text(solo) and isinstance(events[rid][-1], W.Done)
    assert not engine.running and not engine._pending


@pytest.mark.parametrize("model", TINY_MODELS)
def test_prompts_arriving_together_equal_plain_generate_for_every_architecture(model) -> None:
    """A shared prefill is left-padded: absolute positions (gpt2), sliding windows and soft
    caps (gemma2, mistral) and grouped heads must all see each row as if alone."""
    tokenizer = AutoTokenizer.from_pretrained(resolve_model(model))
    plain, ours = build_pair(model, "lora", LocalExecutor.load(model))
    engine = InferenceEngine(ours.eval(), tokenizer, max_context=2048, eos_ids=(), max_batch=8)
    greedy = W.SamplingParams(max_tokens=6, temperature=0)
    requests = [Request(str(i), [t % 1000 for t in p], greedy) for i, p in enumerate(prompts())]
    events = run(engine, requests, stagger=0)
    for request in requests:
        expected = generated(plain, tokenizer, request.prompt_ids, 6)
        assert text(events[request.id]) == expected, (model, request.id)

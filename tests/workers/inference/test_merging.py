"""A collected request's Deltas merged (`workers.inference.merging`): alone with a fake clock,
and through the engine (in-process executor) against the same request streamed."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from catalogue.resolve import resolve_model
from executor.local import LocalExecutor
from tests.peft_reference import build_pair
from tests.workers.inference.test_engine import MODEL, prompts, run, text
from wire import manager as W
from workers.inference import merging
from workers.inference.engine import InferenceEngine
from workers.inference.merging import FLUSH_S, Merging
from workers.inference.request import Request


class Clock:
    def __init__(self) -> None:
        self.now = 10.0

    def __call__(self) -> float:
        return self.now


def logprob(token: str) -> W.TokenLogprob:
    return W.TokenLogprob(token, -1.0, [], list(token.encode()))


def test_the_first_goes_at_once_then_the_rest_merged_until_due_or_the_end() -> None:
    clock = Clock()
    merger = Merging(clock)
    late = 10.0 + FLUSH_S  # FLUSH_S after the first was sent
    arrivals = [(10.0, "a", None), (10.1, "b", None), (10.2, "c", None),
                (late + 0.05, "d", None), (late + 0.1, "e", None), (late + 0.2, "f", "stop")]
    out = []
    for at, token, finish in arrivals:
        clock.now = at
        out.append(merger.take(W.Delta("r", 1, token, [logprob(token)], finish)))
    assert [[(d.text, d.tokens, d.finish_reason) for d in due] for due in out] == [
        [("a", 1, None)], [], [], [("bcd", 3, None)], [], [("ef", 2, "stop")]]
    assert [t.token for t in out[3][0].logprobs] == ["b", "c", "d"]
    assert {(d.id, d.index) for due in out for d in due} == {("r", 1)}
    assert merger.held == []


def test_logprobs_merge_where_either_side_has_them() -> None:
    assert merging.merged([W.Delta("r", 0, "a"), W.Delta("r", 0, "b")]).logprobs is None
    assert [t.token for t in merging.merged(
        [W.Delta("r", 0, ""), W.Delta("r", 0, "b", [logprob("b")])]).logprobs] == ["b"]


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(resolve_model(MODEL))


@pytest.mark.parametrize("flush_s", [3600.0, 0.0], ids=["at-the-end", "every-token"])
def test_a_collected_request_has_the_streamed_ones_tokens_in_fewer_deltas(
        tokenizer, monkeypatch, flush_s: float) -> None:
    """The same greedy requests (two sequences each, with logprobs), collected and streamed:
    the same text, logprobs and counts; collected, each sequence's first token alone, then
    the rest in one Delta (or, due at once, each token in its own)."""
    monkeypatch.setattr(merging, "FLUSH_S", flush_s)
    _, ours = build_pair(MODEL, "lora", LocalExecutor.load(MODEL))
    events = {}
    for collected in (False, True):
        engine = InferenceEngine(ours.eval(), tokenizer, max_context=2048, eos_ids=(),
                                 max_batch=8)
        params = W.SamplingParams(max_tokens=6, temperature=0, n=2, logprobs=1,
                                  collected=collected)
        requests = [Request(f"{collected}-{i}", p, params) for i, p in enumerate(prompts())]
        events[collected] = list(run(engine, requests).values())
    for streamed, collected in zip(events[False], events[True], strict=True):
        for index in range(2):
            deltas = {c: [e for e in got if isinstance(e, W.Delta) and e.index == index]
                      for c, got in ((False, streamed), (True, collected))}
            assert text(collected, index) == text(streamed, index) != ""
            assert [t.logprob for d in deltas[True] for t in d.logprobs] == pytest.approx(
                [t.logprob for d in deltas[False] for t in d.logprobs])
            assert [d.tokens for d in deltas[False]] == [1] * 6
            assert [d.tokens for d in deltas[True]] == ([1, 5] if flush_s else [1] * 6)
            assert deltas[True][-1].finish_reason == deltas[False][-1].finish_reason == "length"
        done = [e for e in collected if isinstance(e, W.Done)]
        assert [d.completion_tokens for d in done] == [12]
        assert isinstance(collected[-1], W.Done)

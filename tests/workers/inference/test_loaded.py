"""workers.inference.loaded: whether a request uses a resident adapter, each engine's requests
read once for all the adapters a settle asks about."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from catalogue.resolve import resolve_model
from executor.local import LocalExecutor
from wire import manager as W
from workers.inference.engine import InferenceEngine
from workers.inference.loaded import InUse, Loaded
from workers.inference.request import Request
from workers.remote.build import remote_model

MODEL = "tiny-llama"


@pytest.fixture(scope="module")
def engines():
    tokenizer = AutoTokenizer.from_pretrained(resolve_model(MODEL))
    model = remote_model(MODEL, LocalExecutor.load(MODEL))
    return [InferenceEngine(model, tokenizer, max_context=2048, eos_ids=(), max_batch=16)
            for _ in range(3)]


def waiting(engine: InferenceEngine, *adapters: str | None, prefill=None) -> None:
    for adapter in adapters:
        engine.waiting.append(Request(f"r{len(engine.waiting)}", [1, 2, 3], W.SamplingParams(),
                                      adapter=adapter, prefill=prefill))


def test_a_settles_answers_are_those_of_its_engines_requests(engines) -> None:
    mixed, own, idle = engines
    prompt_model = object()  # a prompt tuning adapter's model: only its identity is compared
    waiting(mixed, "a1", "a3", None, "a1")
    waiting(mixed, None, prefill=prompt_model)
    waiting(own, None)
    resident = [Loaded(f"t/a{i}@1", f"a{i}", mixed, shared=True) for i in range(5)] + [
        Loaded("t/own@1", "own", own, shared=False),
        Loaded("t/idle@1", "idle", idle, shared=False),
        Loaded("t/prompt@1", "p", mixed, shared=False, prefill=prompt_model),
        Loaded("t/prompt@2", "q", mixed, shared=False, prefill=object())]
    in_use = InUse()
    busy = [a.model for a in resident if a.busy(in_use)]
    assert busy == ["t/a1@1", "t/a3@1", "t/own@1", "t/prompt@1"]
    assert busy == [a.model for a in resident if a.busy()]  # each asked alone: the same


def test_one_settle_reads_its_engines_requests_as_they_were_when_first_asked(engines) -> None:
    mixed = engines[0]
    mixed.waiting.clear()
    waiting(mixed, "a1")
    in_use = InUse()
    first, second = (Loaded(f"t/a{i}@1", f"a{i}", mixed, shared=True) for i in (1, 2))
    assert first.busy(in_use) and not second.busy(in_use)
    waiting(mixed, "a2")
    assert not second.busy(in_use) and second.busy(InUse())

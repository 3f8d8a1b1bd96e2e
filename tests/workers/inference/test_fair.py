"""A shared worker's tenants take turns in its engine's queue (`workers/inference/fair.py`): a
tenant's request that arrives behind another's many prompts is admitted, or embedded, in the
next steps, a turn each, not after them all; one tenant's requests stay first come, first
served."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from catalogue.resolve import resolve_model
from tests.peft_reference import embedding_of
from tests.workers.inference.test_adapters import adapters
from wire import manager as W
from wire.spawner import WorkerSpec
from workers.inference import embedding
from workers.inference.fair import FairQueue
from workers.inference.request import Request
from workers.inference.worker import _generate, build_adapters, preload

EMBED = W.SamplingParams(max_tokens=0, embed=True)


def queued(*arrivals: str) -> FairQueue:
    """Requests of these tenants added in this order, each named tenant and its count so far."""
    queue, counts = FairQueue(), {}
    for tenant in arrivals:
        counts[tenant] = counts.get(tenant, -1) + 1
        queue.add(Request(f"{tenant}{counts[tenant]}", [1], EMBED, tenant=tenant))
    return queue


def ids(queue: FairQueue) -> list[str]:
    return [r.id for r in queue]


def test_tenants_take_turns_and_each_ones_requests_keep_their_order() -> None:
    assert ids(queued("a", "a", "a", "a", "b", "c", "c")) == ["a0", "b0", "c0", "a1", "c1",
                                                               "a2", "a3"]
    assert ids(queued(*"aaaa")) == ["a0", "a1", "a2", "a3"]  # one tenant's: as they came
    queue = queued("a", "a", "a", "a", "b", "c", "c")
    for _ in range(4):
        queue.popleft()  # a0, b0, c0, a1 served
    queue.add(Request("b1", [1], EMBED, tenant="b"))
    queue.add(Request("d0", [1], EMBED, tenant="d"))
    assert ids(queue) == ["c1", "b1", "d0", "a2", "a3"]  # not before the head's turn
    queue.drop("a2")
    assert ids(queue) == ["c1", "b1", "d0", "a3"]


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(resolve_model("tiny-llama"))


def test_a_tenant_behind_anothers_many_prompts_goes_in_the_next_step(tokenizer,
                                                                      monkeypatch) -> None:
    monkeypatch.setattr(embedding, "STEP_TOKENS", 12)  # two of a's inputs a step
    held = adapters(tokenizer)
    engine, _ = held.route("base", None)
    for i in range(8):
        engine.add(Request(f"a{i}", [1, 7, 9, 11, 13], EMBED, tenant="a"))
    engine.add(Request("b-embed", [1, 5, 6], EMBED, tenant="b"))
    engine.add(Request("b-talk", [1, 5, 6], W.SamplingParams(max_tokens=2, temperature=0,
                                                             ignore_eos=True), tenant="b"))
    first, second = engine.step(), engine.step()
    answered = [e.id for e in first if isinstance(e, W.Done) and e.embedding]
    assert answered == ["a0", "b-embed"]  # a0's turn came first; b's next, not after a7
    assert [e.id for e in second if isinstance(e, W.Started)] == ["a1", "a2", "b-talk"]
    done = {e.id: e for e in first if isinstance(e, W.Done)}
    got = torch.frombuffer(bytearray(done["b-embed"].embedding), dtype=torch.float32)
    plain = AutoModelForCausalLM.from_pretrained(resolve_model("tiny-llama"))
    assert torch.allclose(got, embedding_of(plain, [1, 5, 6]), atol=2e-5)
    rest = [e.id for e in second if isinstance(e, W.Done) and e.embedding]
    while engine.has_work():
        rest += [e.id for e in engine.step() if isinstance(e, W.Done) and e.embedding]
    assert rest == [f"a{i}" for i in range(1, 8)]  # a's in its own order


def test_a_workers_requests_carry_their_tenant_into_its_queue(executor_for) -> None:
    """What the turns go by: the tenant a `Generate` names, each request placed in its turn."""
    preloaded = preload("tiny-llama")
    spec = WorkerSpec(key="shared", tenant="*", base="tiny-llama",
                      executor=executor_for("tiny-llama").endpoint, manager="inproc://unused")
    engine = (held := build_adapters(spec, preloaded)).engine
    for request_id, tenant in [("a0", "acme"), ("a1", "acme"), ("b0", "beta")]:
        assert _generate(W.Generate(request_id, tenant, "tiny-llama", EMBED,
                                    prompt_ids=[5, 6, 7]), held, preloaded) == []
    assert [(r.id, r.tenant) for r in engine.waiting] == [("a0", "acme"), ("b0", "beta"),
                                                          ("a1", "acme")]

"""A shared worker's tenants take turns in its engine's queue (`workers/inference/fair.py`): a
tenant's request that arrives behind another's many prompts is admitted, or embedded, in the
next steps, a turn each, not after them all; a tenant's place in each turn goes round its own
API requests, each one's prompts in their order (prompts of no request's: first come, first
served). Flex requests wait behind every interactive one, in turns of their own, and leave an
engine a quarter of its seats for the interactive ones that come while they run."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from catalogue.resolve import resolve_model
from tests.peft_reference import embedding_of
from tests.workers.inference.test_adapters import adapters, plain_tokens
from wire import manager as W
from wire.spawner import WorkerSpec
from workers.inference import embedding
from workers.inference.fair import FairQueue
from workers.inference.preloaded import preload
from workers.inference.request import Request
from workers.inference.worker import _generate, build_adapters
from workers.remote.client import ExecutorClient

EMBED = W.SamplingParams(max_tokens=0, embed=True)
FLEX = W.SamplingParams(max_tokens=0, embed=True, flex=True)
TALK = W.SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)


def queued(*arrivals: str) -> FairQueue:
    """Requests of these tenants added in this order, each named tenant and its count so far;
    a tenant written in capitals sends flex requests."""
    queue, counts = FairQueue(), {}
    for tenant in arrivals:
        counts[tenant] = counts.get(tenant, -1) + 1
        queue.add(Request(f"{tenant}{counts[tenant]}", [1], FLEX if tenant.isupper() else EMBED,
                          tenant=tenant.lower()))
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
    queue.drop({"a2"})
    assert ids(queue) == ["c1", "b1", "d0", "a3"]
    queue.drop({"c1", "d0", "a9"})  # several at once; one that does not wait changes nothing
    assert ids(queue) == ["b1", "a3"]


def test_a_tenants_place_in_each_turn_goes_round_its_requests() -> None:
    queue = FairQueue()
    for i in range(6):
        queue.add(Request(f"e{i}", [1], EMBED, tenant="a", group="embeddings"))
    queue.add(Request("b0", [1], EMBED, tenant="b", group="b"))
    queue.add(Request("chat", [1], TALK, tenant="a", group="chat"))
    for i in range(2):
        queue.add(Request(f"p{i}", [1], TALK, tenant="a", group="two prompts"))
    queue.settle()
    assert ids(queue) == ["e0", "b0", "chat", "p0", "e1", "p1", "e2", "e3", "e4", "e5"]
    assert [r.turn for r in queue] == [0, 0, 1, 2, 3, 4, 5, 6, 7, 8]  # a's places kept
    for _ in range(3):
        queue.popleft()  # e0, b0, chat served
    queue.add(Request("p2", [1], TALK, tenant="a", group="two prompts"))  # as a's last
    queue.add(Request("b1", [1], EMBED, tenant="b", group="b"))
    queue.settle()
    assert ids(queue) == ["p0", "b1", "e1", "p1", "e2", "p2", "e3", "e4", "e5"]
    for _ in range(5):
        queue.popleft()
    queue.add(Request("chat2", [1], TALK, tenant="a", group="chat2"))
    queue.settle()
    assert ids(queue) == ["p2", "e3", "chat2", "e4", "e5"]
    for _ in range(3):
        queue.popleft()
    queue.add(Request("e6", [1], EMBED, tenant="a", group="embeddings"))
    queue.settle()  # one request's left: its prompts in their order
    assert ids(queue) == ["e4", "e5", "e6"] and not queue.mixed
    queue.add(Request("chat3", [1], TALK, tenant="a", group="chat3"))
    queue.settle()
    assert queue.mixed == {(False, "a")}
    queue.add(Request("chat4", [1], TALK, tenant="a", group="chat4"))
    for request_id in ids(queue):
        queue.drop({request_id})  # aborted before the step
    queue.settle()
    assert not queue and not queue.mixed


def test_flex_requests_wait_behind_every_interactive_one_taking_turns_of_their_own() -> None:
    queue = queued("A", "A", "A", "b", "C", "a", "b", "C")
    assert ids(queue) == ["b0", "a0", "b1", "A0", "C0", "A1", "C1", "A2"]
    for _ in range(4):
        queue.popleft()  # b0, a0, b1, A0 served
    queue.add(Request("D0", [1], FLEX, tenant="d"))
    queue.add(Request("b2", [1], EMBED, tenant="b"))
    assert ids(queue) == ["b2", "C0", "D0", "A1", "C1", "A2"]  # D in the flex head's turn


def test_flex_requests_hold_at_most_their_seats_and_one_alone_where_none_runs() -> None:
    assert [W.flex_seats(n) for n in (1, 2, 4, 16, 32)] == [1, 1, 3, 12, 24]
    wide = W.SamplingParams(n=4, flex=True)
    queue = FairQueue()
    for request_id in ("w0", "w1"):
        queue.add(Request(request_id, [1], wide, tenant="a"))
    assert [r.id for r in queue.seat([], [], 4)] == ["w0"]  # 4 seats: more than flex's 3
    assert list(queue.seat([Request("w0", [1], wide)] * 4, [], 8)) == []  # 8 > flex's 6
    assert [r.id for r in queue.seat([], [Request("i", [1], W.SamplingParams(n=3))], 8)] == \
        ["w1"]  # an interactive prompt coming in by chunks is not flex's


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


def test_a_tenants_chat_behind_its_own_many_inputs_goes_in_the_next_step(tokenizer,
                                                                         monkeypatch) -> None:
    monkeypatch.setattr(embedding, "STEP_TOKENS", 12)  # two inputs a step
    engine, _ = adapters(tokenizer).route("base", None)
    for i in range(8):
        engine.add(Request(f"a{i}", [1, 7, 9, 11, 13], EMBED, tenant="a", group="embeddings"))
    prompt = tokenizer.encode("request a says")
    engine.add(Request("talk", prompt, TALK, tenant="a", group="chat"))
    events = engine.step()
    assert started_ids(events) == ["a0", "a1", "talk"]  # not after a7
    while engine.has_work():
        events += engine.step()
    assert [e.id for e in events if isinstance(e, W.Done) and e.embedding] == \
        [f"a{i}" for i in range(8)]
    text = "".join(e.text for e in events if isinstance(e, W.Delta) and e.id == "talk")
    assert tokenizer.encode(text) == tokenizer.encode(tokenizer.decode(
        plain_tokens(None, prompt)))


def test_a_workers_requests_carry_their_tenant_into_its_queue(executor_for) -> None:
    """What the turns go by: the tenant and the API request (`group`) a `Generate` names, each
    request placed in its turn."""
    preloaded = preload("tiny-llama")
    spec = WorkerSpec(key="shared", tenant="*", base="tiny-llama",
                      executor=executor_for("tiny-llama").endpoint, manager="inproc://unused")
    engine = (held := build_adapters(spec, preloaded)).engine
    for request_id, tenant in [("a0", "acme"), ("a1", "acme"), ("b0", "beta")]:
        assert _generate(W.Generate(request_id, tenant, "tiny-llama", EMBED,
                                    prompt_ids=[5, 6, 7], group=f"{tenant}-run"),
                         held, preloaded) == []
    assert [(r.id, r.tenant, r.group) for r in engine.waiting] == [
        ("a0", "acme", "acme-run"), ("b0", "beta", "beta-run"), ("a1", "acme", "acme-run")]


def started_ids(events: list[W.Message]) -> list[str]:
    return [e.id for e in events if isinstance(e, W.Started)]


def test_an_interactive_request_gets_a_seat_beside_flex_ones_that_wait(tokenizer) -> None:
    held = adapters(tokenizer)  # 16 seats: flex requests hold at most 12
    engine, _ = held.route("base", None)
    for i in range(13):
        engine.add(Request(f"f{i}", [1, 7, 9, 11], W.SamplingParams(
            max_tokens=4, temperature=0, ignore_eos=True, flex=True), tenant="a"))
    assert started_ids(engine.step()) == [f"f{i}" for i in range(12)]
    prompt = tokenizer.encode("request b says")
    engine.add(Request("b", prompt, W.SamplingParams(max_tokens=8, temperature=0,
                                                     ignore_eos=True), tenant="b"))
    events = engine.step()
    assert started_ids(events) == ["b"]  # ahead of f12, which waits for a flex seat
    order = []
    while engine.has_work():
        events += (step := engine.step())
        order += [(type(e).__name__, e.id) for e in step if isinstance(e, W.Started | W.Done)]
    assert order.index(("Started", "f12")) > order.index(("Done", "f0"))
    text = "".join(e.text for e in events if isinstance(e, W.Delta) and e.id == "b")
    assert tokenizer.encode(text) == tokenizer.encode(tokenizer.decode(
        plain_tokens(None, prompt)))


def test_a_workers_steps_of_flex_requests_only_are_flex_calls(executor_for, tokenizer) -> None:
    """In the executor's flex lane (`Call.flex`) while every request the engine holds is flex;
    the step an interactive request joins is not (its rows ride with the interactive ones)."""
    process = executor_for("tiny-llama")
    spec = WorkerSpec(key="acme", tenant="acme", base="tiny-llama", executor=process.endpoint,
                      manager="inproc://unused")
    engine = build_adapters(spec, preload("tiny-llama")).engine
    watcher = ExecutorClient(process.endpoint, name="flex-watcher")

    def moved(steps: int) -> tuple[dict[str, int], list[W.Message]]:
        before = {lane: f.calls for lane, f in watcher.stats().lanes.items()}
        events = [e for _ in range(steps) for e in engine.step()]
        after = watcher.stats().lanes
        return {lane: f.calls - before[lane] for lane, f in after.items()}, events

    try:
        prompt = tokenizer.encode("request f says")
        engine.add(Request("f", prompt, W.SamplingParams(
            max_tokens=8, temperature=0, ignore_eos=True, flex=True), tenant="acme"))
        lanes, events = moved(3)
        assert lanes["flex"] > 0 and lanes["decode"] == lanes["prefill"] == 0
        engine.add(Request("i", [1, 5, 6], W.SamplingParams(max_tokens=2, temperature=0,
                                                            ignore_eos=True), tenant="acme"))
        lanes, more = moved(1)
        assert lanes["flex"] == 0 and lanes["decode"] + lanes["prefill"] > 0
        while engine.has_work():
            more += engine.step()
        text = "".join(e.text for e in [*events, *more] if isinstance(e, W.Delta) and e.id == "f")
        assert tokenizer.encode(text) == tokenizer.encode(tokenizer.decode(
            plain_tokens(None, prompt)))
    finally:
        watcher.close()

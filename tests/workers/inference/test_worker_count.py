"""An inference worker asked only to count a prompt (`SamplingParams.count`, the Responses API's
input_tokens) against a real executor process: it renders the prompt as a run would (the chat
template, truncation) and answers with the count, and nothing runs, in the worker or the
executor."""

from __future__ import annotations

from transformers import AutoTokenizer

from catalogue.resolve import resolve_model
from tests.helpers import ExecutorProcess
from wire import manager as W
from wire.spawner import WorkerSpec
from workers.inference.preloaded import preload
from workers.inference.worker import _generate, build_adapters
from workers.remote.client import ExecutorClient

MODEL = "tiny-llama"
CHAT = [("system", "Be brief."), ("user", "Say hello.")]


def executor_calls(endpoint: str) -> int:
    watcher = ExecutorClient(endpoint, name="watcher")
    try:
        return sum(lane.calls for lane in watcher.stats().lanes.values())
    finally:
        watcher.close()


def test_a_count_renders_the_prompt_and_runs_nothing(executor_for) -> None:
    llama: ExecutorProcess = executor_for(MODEL)
    preloaded = preload(MODEL)
    spec = WorkerSpec(key="count-worker", tenant="acme", base=MODEL, executor=llama.endpoint,
                      manager="inproc://unused")
    adapters = build_adapters(spec, preloaded)
    template = AutoTokenizer.from_pretrained(resolve_model(MODEL)).apply_chat_template(
        [{"role": role, "content": text} for role, text in CHAT], add_generation_prompt=True,
        return_dict=False)
    count = W.SamplingParams(max_tokens=0, count=True)
    before = executor_calls(llama.endpoint)
    events = _generate(W.Generate("c1", "acme", MODEL, count, messages=[
        W.ChatMessage(role, text) for role, text in CHAT]), adapters, preloaded)
    assert events == [W.Started("c1", len(template)), W.Done("c1", len(template), 0)]
    long = list(range(5, 5 + preloaded.max_context + 10))  # more than any run may read
    assert _generate(W.Generate("c2", "acme", MODEL, count, prompt_ids=long), adapters,
                     preloaded)[0] == W.Started("c2", len(long))
    assert not adapters.engine.has_work()
    assert executor_calls(llama.endpoint) == before

"""A packed step's executor calls are marked a decode step's: a real executor puts them in its
decode lane whatever their rows (a chunk's calls, a batch of over 32 rows), on the doorbell's
header and on the socket's message alike."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from catalogue.resolve import resolve_model
from tests.peft_reference import build_pair
from tests.workers.inference.test_chunks import plain_text, prompt, steps_of, text
from tests.workers.inference.test_packed import GREEDY, input_shapes
from wire import manager as W
from workers.inference.engine import InferenceEngine
from workers.inference.request import Request


@pytest.mark.parametrize("doorbell", [True, False], ids=["doorbell", "socket"])
def test_a_packed_steps_calls_go_in_the_executors_decode_lane(doorbell: bool,
                                                             executor_for) -> None:
    """A real executor: a 100-token prompt at 48 a step beside a running row makes calls of
    49 rows, over the 32 by which an unmarked call is taken for a decode step; marked a decode
    step's, they all go in the decode lane (a prefill's would be sliced and run after other
    tenants' decode steps), on the doorbell's header and on the socket's message alike."""
    from workers.remote.client import ExecutorClient

    client = ExecutorClient(executor_for("tiny-llama").endpoint, name=f"packed-{doorbell}",
                            use_doorbell=doorbell)
    try:
        tokenizer = AutoTokenizer.from_pretrained(resolve_model("tiny-llama"))
        plain, ours = build_pair("tiny-llama", "lora", client)
        engine = InferenceEngine(ours.eval(), tokenizer, max_context=1024, eos_ids=(),
                                 chunk_tokens=48)
        shapes = input_shapes(engine.decode_model)
        before = client.stats().lanes
        engine.add(Request("running", prompt(5), W.SamplingParams(max_tokens=8, temperature=0)))
        steps = [engine.step()]
        engine.add(Request("long", prompt(100, seed=1), GREEDY))
        steps += steps_of(engine)
        after = client.stats().lanes
    finally:
        client.close()
    assert shapes[2:5] == [(1, 49), (1, 49), (1, 5)]  # packed steps: the row and a chunk
    assert after["prefill"].calls == before["prefill"].calls  # none taken for a prefill
    assert after["decode"].calls > before["decode"].calls
    assert text(steps, "long") == plain_text(plain.eval(), tokenizer, prompt(100, seed=1), 12)


def test_a_decode_step_of_more_rows_than_a_lane_guess_goes_in_the_decode_lane(executor_for):
    """A real executor: 40 rows decoding together make calls of 40 rows, which by their rows
    alone would be taken for a prefill."""
    from workers.remote.client import ExecutorClient

    client = ExecutorClient(executor_for("tiny-llama").endpoint, name="wide-batch")
    try:
        tokenizer = AutoTokenizer.from_pretrained(resolve_model("tiny-llama"))
        _, ours = build_pair("tiny-llama", "lora", client)
        engine = InferenceEngine(ours.eval(), tokenizer, max_context=1024, eos_ids=(),
                                 max_batch=40)
        for n in range(40):
            engine.add(Request(f"r{n}", prompt(3, seed=n), W.SamplingParams(max_tokens=4,
                                                                             temperature=0)))
        engine.step()  # the prompts' prefill (a prefill's calls) and a first decode step
        shapes = input_shapes(engine.decode_model)
        before = client.stats().lanes
        steps_of(engine)
        after = client.stats().lanes
    finally:
        client.close()
    assert shapes == [(40, 1)] * 2  # two more decode steps of all 40 rows
    assert after["prefill"].calls == before["prefill"].calls
    assert after["decode"].calls > before["decode"].calls

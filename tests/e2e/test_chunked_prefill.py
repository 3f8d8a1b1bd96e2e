"""A long prompt that arrives while a stream runs in the same worker comes in a chunk a step
(`workers/inference/chunks.py`): the stream keeps getting tokens meanwhile, and both answers are
plain peft's greedy ones. gamma asks 1 us between tokens (`GAMMA_TARGETS`), so its worker's
chunks are as small as they go, whatever it measured."""

from __future__ import annotations

import threading
import time

import pytest

from tests.e2e.adapters import MODEL
from tests.e2e.conftest import Deployment

pytestmark = pytest.mark.slow
PROMPT = "The quick brown fox"
STREAMED = 300
CONTEXT = 2048  # tiny-llama's


def test_a_stream_keeps_flowing_while_a_long_prompt_comes_in(deployment: Deployment) -> None:
    reference = deployment.reference(MODEL)
    short = reference.ids(PROMPT)
    long = (short * (CONTEXT // len(short) + 1))[:CONTEXT - 8]
    client = deployment.client("gamma")
    arrivals: list[float] = []
    parts: list[str] = []
    flowing = threading.Event()

    def stream() -> None:
        for chunk in client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=STREAMED,
                                               temperature=0, stream=True):
            if chunk.choices and chunk.choices[0].text:
                arrivals.append(time.monotonic())
                parts.append(chunk.choices[0].text)
                if len(parts) == 5:
                    flowing.set()

    streaming = threading.Thread(target=stream)
    streaming.start()
    assert flowing.wait(60)
    sent = time.monotonic()
    out = client.completions.create(model=MODEL, prompt=long, max_tokens=8, temperature=0)
    answered = time.monotonic()
    streaming.join(120)
    assert out.choices[0].text == reference.text(reference.greedy(long, 8))
    assert "".join(parts) == reference.text(reference.greedy(short, STREAMED))
    meanwhile = sum(sent < t < answered for t in arrivals)
    # whole, the prompt's prefill is one step: the stream would get ~10 tokens (its 8 and
    # the steps around); in chunks of 16 (gamma's target, measured or not) over 100
    assert meanwhile > 40, (meanwhile, len(arrivals))
    assert arrivals[-1] > answered  # the stream outlived the long prompt's request

"""Background responses through real processes with the official openai SDK: queued at once,
polled to the greedy text plain peft gives (its usage, a conversation to go on from); a streamed
one followed again after its client left, its events whole and in order; a long one cancelled
stops (its worker free for the next request) and stays cancelled."""

from __future__ import annotations

import time

import pytest

from tests.e2e.conftest import Deployment
from tests.e2e.test_metrics import scrape

pytestmark = pytest.mark.slow


def polled(client, response_id: str, timeout_s: float = 120.0):
    seen, deadline = [], time.monotonic() + timeout_s
    while True:
        made = client.responses.retrieve(response_id)
        seen.append(made.status)
        if made.status not in ("queued", "in_progress") or time.monotonic() > deadline:
            return made, seen
        time.sleep(0.02)


def test_a_background_response_is_polled_to_plain_pefts_answer(deployment: Deployment) -> None:
    reference = deployment.reference("acme/lora-a")
    messages = [{"role": "user", "content": "Say hello."}]
    tokens = reference.greedy(reference.ids(messages=messages), 12)
    client = deployment.client("acme")
    queued = client.responses.create(model="acme/lora-a", input="Say hello.", temperature=0,
                                     max_output_tokens=12, background=True)
    assert (queued.status, queued.background, queued.output) == ("queued", True, [])
    made, seen = polled(client, queued.id)
    assert set(seen) <= {"queued", "in_progress", "completed", "incomplete"}
    assert made.output_text == reference.text(tokens) and made.background
    assert made.id == queued.id and made.created_at == queued.created_at
    assert made.usage.input_tokens == len(reference.ids(messages=messages))
    eos = set(reference.model.generation_config.eos_token_id or [])
    ended = next((k + 1 for k, t in enumerate(tokens) if t in eos), None)
    assert (made.status, made.usage.output_tokens) == \
        (("completed", ended) if ended else ("incomplete", 12))
    items = list(client.responses.input_items.list(made.id))
    assert [i.content[0].text for i in items] == ["Say hello."]
    follow = [*messages, {"role": "assistant", "content": made.output_text},
              {"role": "user", "content": "Again."}]
    again = client.responses.create(model="acme/lora-a", input="Again.", temperature=0,
                                    max_output_tokens=4, previous_response_id=made.id)
    assert again.output_text == reference.text(reference.greedy(reference.ids(
        messages=follow), 4))


def test_a_streamed_one_is_followed_again_from_where_its_client_left(
        deployment: Deployment) -> None:
    reference = deployment.reference("acme/lora-a")
    tokens = reference.greedy(reference.ids(messages=[{"role": "user", "content": "Hi"}]), 40)
    client = deployment.client("acme")
    stream = client.responses.create(model="acme/lora-a", input="Hi", temperature=0,
                                     max_output_tokens=40, background=True, stream=True)
    first = []
    for event in stream:
        first.append(event)
        if len(first) == 8:
            break
    stream.close()  # the client leaves; the response runs on
    response_id = first[0].response.id
    assert [e.type for e in first[:3]] == ["response.created", "response.queued",
                                           "response.in_progress"]
    assert first[0].response.status == "queued" and first[0].response.background
    rest = list(client.responses.retrieve(response_id, stream=True,
                                          starting_after=first[-1].sequence_number))
    events = [*first, *rest]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == reference.text(tokens) == rest[-1].response.output_text
    assert rest[-1].type in ("response.completed", "response.incomplete")
    assert client.responses.retrieve(response_id).model_dump() == \
        rest[-1].response.model_dump()
    again = list(client.responses.retrieve(response_id, stream=True))
    assert [e.model_dump() for e in again] == [e.model_dump() for e in events]


def test_a_cancelled_background_response_stops_and_stays_cancelled(
        deployment: Deployment) -> None:
    client = deployment.client("acme")
    inflight = ("symbiosis_inflight_requests", (("tenant", "acme"),))
    long = client.responses.create(model="tiny-llama", input="Tell a long story.",
                                   max_output_tokens=1900, temperature=0,
                                   background=True)  # greedy: 1,900 tokens without an EOS
    deadline = time.monotonic() + 60
    while client.responses.retrieve(long.id).status == "queued" and \
            time.monotonic() < deadline:
        time.sleep(0.02)
    assert client.responses.retrieve(long.id).status == "in_progress"
    assert scrape(deployment)[inflight] == 1  # generating
    cancelled = client.responses.cancel(long.id)
    assert (cancelled.status, cancelled.output) == ("cancelled", [])
    deadline = time.monotonic() + 10
    while scrape(deployment)[inflight] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert scrape(deployment)[inflight] == 0  # its run stopped, its slot free
    short = client.responses.create(model="tiny-llama", input="Hi", max_output_tokens=3)
    assert short.status in ("completed", "incomplete")
    kept = client.responses.retrieve(long.id)
    assert (kept.status, kept.output, kept.usage) == ("cancelled", [], None)

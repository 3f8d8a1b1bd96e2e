"""The Batch API through real processes with the official openai SDK: a batch's answers are those
of its endpoint (greedy text equal to plain peft's, with its token counts; embeddings equal to
plain peft's), at the flex tier (as a client's flex request is answered), a bad request is its
line's error, a cancelled batch stops and names the requests it never ran (its input sent in
parts, through the Uploads API), and a batch is its tenant's alone."""

from __future__ import annotations

import json
import time

import openai
import pytest

from tests.e2e.conftest import Deployment
from tests.e2e.test_embeddings import close, expected
from wire.manager import MAX_BATCH, flex_seats

pytestmark = pytest.mark.slow
URL = "/v1/chat/completions"
PROMPTS = ["Hello", "Tell me a story", "Bye"]


def submit(client: openai.OpenAI, bodies: list[dict], parts: bool = False, url: str = URL,
           **fields):
    """A batch of `bodies` to `url`, its input file uploaded whole or (`parts`) in parts of 500
    bytes."""
    rows = [{"custom_id": f"q{k}", "method": "POST", "url": url, "body": body}
            for k, body in enumerate(bodies)]
    data = "\n".join(map(json.dumps, rows)).encode()
    source = client.uploads.upload_file_chunked(
        file=data, bytes=len(data), filename="in.jsonl", mime_type="application/jsonl",
        purpose="batch", part_size=500).file if parts else \
        client.files.create(file=("in.jsonl", data), purpose="batch")
    return client.batches.create(input_file_id=source.id, endpoint=url,
                                 completion_window="24h", **fields)


def finished(client: openai.OpenAI, batch_id: str, timeout_s: float = 180):
    deadline = time.monotonic() + timeout_s
    while (batch := client.batches.retrieve(batch_id)).status in ("in_progress", "cancelling"):
        assert time.monotonic() < deadline, batch
        time.sleep(0.2)
    return batch


def lines(client: openai.OpenAI, file_id: str) -> list[dict]:
    return [json.loads(line) for line in client.files.content(file_id).text.splitlines()]


def test_a_batch_answers_as_its_endpoint_and_plain_peft_would(deployment: Deployment) -> None:
    client = deployment.client("acme")
    bodies = [{"model": "acme/lora-a", "messages": [{"role": "user", "content": p}],
               "max_tokens": 6, "temperature": 0} for p in PROMPTS]
    batch = submit(client, [*bodies, {**bodies[0], "max_tokens": -1}],
                   metadata={"run": "nightly"})
    assert batch.status == "in_progress" and batch.metadata == {"run": "nightly"}
    done = finished(client, batch.id)
    assert done.status == "completed" and done.completed_at >= done.created_at
    assert (done.request_counts.total, done.request_counts.completed,
            done.request_counts.failed) == (4, 3, 1) and done.model == "acme/lora-a"
    reference = deployment.reference("acme/lora-a")
    answers = {line["custom_id"]: line["response"] for line in lines(client, done.output_file_id)}
    assert list(answers) == ["q0", "q1", "q2"]
    for k, prompt in enumerate(PROMPTS):
        ids = reference.ids(messages=[{"role": "user", "content": prompt}])
        body = answers[f"q{k}"]["body"]
        assert answers[f"q{k}"]["status_code"] == 200 and body["service_tier"] == "flex"
        assert body["choices"][0]["message"]["content"] == \
            reference.text(reference.greedy(ids, 6))
        assert body["usage"]["prompt_tokens"] == len(ids)
    used = [a["body"]["usage"] for a in answers.values()]
    assert (done.usage.input_tokens, done.usage.output_tokens, done.usage.total_tokens) == (
        sum(u["prompt_tokens"] for u in used), 18, sum(u["total_tokens"] for u in used))
    (error,) = lines(client, done.error_file_id)
    assert error["custom_id"] == "q3" and error["response"]["status_code"] == 400 and \
        error["response"]["body"]["error"]["param"] == "max_tokens"
    assert done.id in [b.id for b in client.batches.list(limit=100).data]
    with pytest.raises(openai.NotFoundError):
        deployment.client("beta").batches.retrieve(done.id)
    with pytest.raises(openai.NotFoundError):
        deployment.client("beta").files.content(done.output_file_id)


def test_a_flex_request_answers_as_plain_peft_would_naming_its_tier(
        deployment: Deployment) -> None:
    client, reference = deployment.client("acme"), deployment.reference("acme/lora-a")
    messages = [{"role": "user", "content": PROMPTS[1]}]
    ids = reference.ids(messages=messages)
    for tier in ("flex", "default"):
        answer = client.chat.completions.create(model="acme/lora-a", messages=messages,
                                                max_tokens=6, temperature=0, service_tier=tier)
        assert answer.service_tier == tier
        assert answer.choices[0].message.content == reference.text(reference.greedy(ids, 6))
    response = client.responses.create(model="acme/lora-a", input=PROMPTS[1], temperature=0,
                                       max_output_tokens=6, service_tier="flex")
    assert response.service_tier == "flex"


def test_a_batch_of_embeddings_answers_as_plain_peft_would(deployment: Deployment) -> None:
    client = deployment.client("acme")
    bodies = [{"model": "acme/lora-a", "input": p} for p in PROMPTS]
    done = finished(client, submit(client, bodies, url="/v1/embeddings").id)
    assert done.status == "completed" and done.request_counts.completed == 3
    reference = deployment.reference("acme/lora-a")
    answers = {line["custom_id"]: line["response"] for line in lines(client, done.output_file_id)}
    for k, prompt in enumerate(PROMPTS):
        ids = reference.ids(prompt)
        body = answers[f"q{k}"]["body"]
        assert body["usage"] == {"prompt_tokens": len(ids), "total_tokens": len(ids)}
        assert close(body["data"][0]["embedding"], expected(reference, ids))
    assert (done.usage.input_tokens, done.usage.output_tokens) == (
        sum(len(reference.ids(p)) for p in PROMPTS), 0)


def test_a_cancelled_batch_stops_and_names_what_it_never_ran(deployment: Deployment) -> None:
    client = deployment.client("acme")
    long = {"model": "acme/lora-a", "messages": [{"role": "user", "content": "Go on"}],
            "max_tokens": 1000, "temperature": 0, "ignore_eos": True}
    at_once = flex_seats(MAX_BATCH)  # a batch's lines in flight: its worker's flex seats
    batch = submit(client, [long] * (at_once + 4), parts=True)  # (the Uploads API's, in parts)
    with pytest.raises(openai.ConflictError):  # its input is read while it runs
        client.files.delete(batch.input_file_id)
    cancelling = client.batches.cancel(batch.id)
    assert cancelling.status == "cancelling" and cancelling.cancelling_at
    done = finished(client, batch.id)
    assert done.status == "cancelled" and done.cancelled_at >= done.cancelling_at
    never = [e for e in lines(client, done.error_file_id) if e["error"]]
    ran = done.request_counts.completed + done.request_counts.failed
    assert len(never) == at_once + 4 - ran >= 4  # each 1,000 tokens long
    assert {e["error"]["code"] for e in never} == {"batch_cancelled"}
    assert client.files.delete(batch.input_file_id).deleted
    assert client.batches.cancel(batch.id).status == "cancelled"  # as it is

"""A tenant's tokens per minute through real processes, with the official openai SDK: a tenant
added to the serving gateway's tenants file (`symbiosis tenants create`'s function) takes, for
each request, what the response's own `usage` says it read and wrote; a long answer leaves the
bucket owing, and the next request is a 429 saying how long until the minute has paid it back;
a tenant without limits sees none of it; a batch's line refused waits as long as its 429
says. A chat's prompt, estimated as it arrives, is set right by the worker's count once it
ends."""

from __future__ import annotations

import time

import httpx
import openai
import pytest

from gateway.tenants import create_tenant, revoke_tenant
from tests.e2e.adapters import MODEL
from tests.e2e.conftest import OPERATOR, Deployment
from tests.e2e.test_batches import finished, submit

pytestmark = pytest.mark.slow
PER_MINUTE = 120  # two tokens a second
PROMPT = list(range(5, 15))  # ten tokens
WHOLE = {"ignore_eos": True}  # every answer as long as its max_tokens


@pytest.fixture()
def metered(deployment: Deployment):
    path = deployment.stack.data_dir / "tenants.json"
    key = create_tenant(path, "delta", tokens_per_minute=PER_MINUTE)
    client = openai.OpenAI(base_url=f"{deployment.stack.base_url}/v1", api_key=key,
                           max_retries=0, timeout=120)
    deadline = time.monotonic() + 10
    while True:  # the gateway follows the file within a second
        try:
            client.models.list()
            break
        except openai.AuthenticationError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
    yield client
    revoke_tenant(path, "delta")


def test_the_tokens_taken_are_the_usages_and_an_owing_bucket_waits(
        metered: openai.OpenAI, deployment: Deployment) -> None:
    started = time.monotonic()
    raw = metered.completions.with_raw_response.create(model=MODEL, prompt=PROMPT,
                                                       max_tokens=40, extra_body=WHOLE)
    first = raw.parse().usage.total_tokens
    assert first == len(PROMPT) + 40
    remaining = int(raw.headers["x-ratelimit-remaining-tokens"])
    refilled = 2 * (time.monotonic() - started)
    assert PER_MINUTE - first <= remaining <= PER_MINUTE - first + refilled + 1
    assert raw.headers["x-ratelimit-limit-tokens"] == str(PER_MINUTE)
    assert "x-ratelimit-limit-requests" not in raw.headers  # no requests per minute set

    with metered.chat.completions.with_streaming_response.create(  # a chat's prompt estimated
            model=MODEL, messages=[{"role": "user", "content": "Say something long."}],
            max_tokens=80, extra_body=WHOLE, stream=True,
            stream_options={"include_usage": True}) as streamed:
        at_start = int(streamed.headers["x-ratelimit-remaining-tokens"])  # its prompt taken
        chunks = list(streamed.parse())
    assert at_start < remaining + 2 * (time.monotonic() - started) + 1
    second = chunks[-1].usage.total_tokens
    assert second == chunks[-1].usage.prompt_tokens + 80
    owed = first + second - PER_MINUTE  # beyond a minute's worth, less what has refilled

    with pytest.raises(openai.RateLimitError) as refused:
        metered.completions.create(model=MODEL, prompt=PROMPT, max_tokens=1)
    waited = time.monotonic() - started
    wait_ms = int(refused.value.response.headers["retry-after-ms"])
    most = (owed + len(PROMPT)) * 500  # the prompt's tokens and what is owed, at 2 a second
    assert most - 1000 * waited - 500 <= wait_ms <= most + 1
    assert "tokens per minute (TPM) of tenant delta" in refused.value.message
    assert refusals(deployment) == 1
    batch = submit(metered, [{"model": MODEL, "messages": [{"role": "user", "content": "Hi"}],
                              "max_tokens": 1}])  # its line waits for the minute to pay back

    with pytest.raises(openai.BadRequestError) as too_large:
        metered.completions.create(model=MODEL, prompt=list(range(5, 5 + PER_MINUTE + 1)),
                                   max_tokens=1)
    assert too_large.value.code == "tokens_per_minute_exceeded"

    free = deployment.client("acme").completions.with_raw_response.create(
        model=MODEL, prompt=PROMPT, max_tokens=40)
    assert free.parse().usage.total_tokens > 0
    assert not [h for h in free.headers if h.startswith("x-ratelimit")]

    done = finished(metered, batch.id, timeout_s=120)
    assert done.request_counts.completed == 1
    repaid_s = (wait_ms - len(PROMPT) * 500) / 1000  # what was owed, without the 429's prompt
    assert time.monotonic() - started >= waited + repaid_s - 0.1
    assert refusals(deployment) <= 3  # the line waited as its 429 said, not every half second


def refusals(deployment: Deployment) -> float:
    metrics = httpx.get(f"{deployment.stack.base_url}/metrics", headers=OPERATOR).text
    line = 'symbiosis_rejected_total{reason="tokens_per_minute",tenant="delta"} '
    return next((float(row.split()[-1]) for row in metrics.splitlines()
                 if row.startswith(line)), 0.0)

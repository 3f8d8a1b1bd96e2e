"""A client's `x-request-id` names its request in the answer and the logs, never on the wire:
two requests that share one, even two tenants', each get their own answer (replies are routed by
the prompts' ids, so shared ids would hand one tenant's tokens to the other)."""

from __future__ import annotations

import threading

import pytest

from tests.e2e.conftest import Deployment

pytestmark = pytest.mark.slow
ASKS = [("acme", "acme/lora-a", "The quick brown fox"), ("beta", "beta/ia3-b", "Once upon a time"),
        ("acme", "acme/lora-a", "Far away, beyond the hills")]  # the last one streamed
TOKENS = 16


def ask_together(deployment: Deployment, request_id: str) -> list:
    """Every ask sent at once under `request_id`: each raw answer, or the exception it raised."""
    together, answers = threading.Barrier(len(ASKS)), [None] * len(ASKS)

    def ask(k: int) -> None:
        tenant, model, prompt = ASKS[k]
        client = deployment.client(tenant, timeout=60)
        together.wait()
        try:
            answers[k] = client.completions.with_raw_response.create(
                model=model, prompt=prompt, max_tokens=TOKENS, temperature=0,
                stream=k == len(ASKS) - 1, extra_headers={"x-request-id": request_id})
        except Exception as exc:
            answers[k] = exc

    threads = [threading.Thread(target=ask, args=(k,)) for k in range(len(ASKS))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return answers


def test_requests_that_share_an_id_each_get_their_own_answer(deployment: Deployment) -> None:
    expected = []
    for _, model, prompt in ASKS:
        reference = deployment.reference(model)
        expected.append(reference.text(reference.greedy(reference.ids(prompt), TOKENS)))
    for round_ in range(3):
        answers = ask_together(deployment, "shared-id")
        assert not [a for a in answers if isinstance(a, Exception)], f"round {round_}"
        assert [a.headers["x-request-id"] for a in answers] == ["shared-id"] * len(ASKS)
        collected = [a.parse().choices[0].text for a in answers[:-1]]
        streamed = "".join(c.choices[0].text for c in answers[-1].parse() if c.choices)
        assert [*collected, streamed] == expected, f"round {round_}"

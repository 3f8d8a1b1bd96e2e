"""/metrics through real processes: the gateway's counters and token times, the manager's and
the executor's figures, parsed with prometheus_client's own parser; the dashboard's usage view
agrees with them."""

from __future__ import annotations

import time

import httpx
import pytest

from tests.e2e.adapters import MODEL
from tests.e2e.conftest import KEYS, OPERATOR, Deployment
from tests.e2e.test_inference import PROMPT

pytestmark = pytest.mark.slow
ACME = {"tenant": "acme", "tier": "default"}  # acme's token times of the default tier


def scrape(deployment: Deployment) -> dict:
    """/metrics as an operator reads it, parsed: (name, sorted labels) -> value."""
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"{deployment.stack.base_url}/metrics", headers=OPERATOR).text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_metrics_parse_and_their_counters_move(deployment: Deployment) -> None:
    before = scrape(deployment)
    asked = time.monotonic()
    deployment.client("acme").completions.create(model="acme/lora-a", prompt=PROMPT,
                                                 max_tokens=5, temperature=0)
    answered = time.monotonic() - asked
    after = scrape(deployment)

    def moved(name: str, **labels: str) -> float:
        key = (name, tuple(sorted(labels.items())))
        return after.get(key, 0) - before.get(key, 0)

    deadline = time.monotonic() + 10  # the executor's metrics come via the manager's 1 s probe
    while not moved("symbiosis_executor_calls_total", kind="inference") and \
            time.monotonic() < deadline:
        time.sleep(0.5)
        after = scrape(deployment)

    assert moved("symbiosis_requests_total", route="/v1/completions", status="200",
                 tenant="acme") == 1
    assert moved("symbiosis_tokens_total", tenant="acme", model="acme/lora-a", version="1",
                 kind="completion") == 5
    assert moved("symbiosis_responses_total", tenant="acme", model="acme/lora-a",
                 version="1") == 1
    assert moved("symbiosis_request_seconds_count", route="/v1/completions") == 1
    assert moved("symbiosis_time_to_first_token_seconds_count", **ACME) == 1
    assert moved("symbiosis_inter_token_seconds_count", **ACME) == 4  # 5 tokens, 1 row
    waited = (moved("symbiosis_time_to_first_token_seconds_sum", **ACME)
              + moved("symbiosis_inter_token_seconds_sum", **ACME))
    assert 0 < waited <= answered  # arrival to last token, within the client's own wait
    usage = httpx.get(f"{deployment.stack.base_url}/dashboard/api/usage",
                      headers={"Authorization": f"Bearer {KEYS['acme']}"}).json()
    labels = tuple(sorted(ACME.items()))
    assert usage["mean_inter_token_s"] == pytest.approx(
        after[("symbiosis_inter_token_seconds_sum", labels)]
        / after[("symbiosis_inter_token_seconds_count", labels)])

    assert moved("symbiosis_executor_calls_total", kind="inference") > 0
    assert after[("symbiosis_executor_up", ())] == 1
    assert after[("symbiosis_workers", (("state", "ready"),))] >= 1
    acme = (("worker", "acme"),)  # its adapter cache, as the worker reported it
    assert after[("symbiosis_worker_resident_adapters", acme)] >= 1
    assert after[("symbiosis_worker_adapter_bytes", acme)] > 0
    assert after[("symbiosis_worker_adapter_loads_total", acme)] >= 1
    assert ("symbiosis_manager_worker_starts_total", ()) in after
    assert ("symbiosis_jobs", (("status", "running"),)) in after
    assert ("symbiosis_executor_queue_depth", ()) in after

    before = scrape(deployment)  # streamed, two sequences: each one's gaps
    chunks = list(deployment.client("acme").completions.create(
        model="acme/lora-a", prompt=PROMPT, max_tokens=4, n=2, seed=3, stream=True,
        stream_options={"include_usage": True}))
    after = scrape(deployment)
    assert moved("symbiosis_time_to_first_token_seconds_count", **ACME) == 1
    assert moved("symbiosis_inter_token_seconds_count", **ACME) == \
        chunks[-1].usage.completion_tokens - 2

    before = scrape(deployment)  # a flex request's times apart from the default tier's
    deployment.client("acme").chat.completions.create(
        model="acme/lora-a", messages=[{"role": "user", "content": PROMPT}], max_tokens=3,
        temperature=0, service_tier="flex")
    after = scrape(deployment)
    assert moved("symbiosis_time_to_first_token_seconds_count", tenant="acme", tier="flex") == 1
    assert moved("symbiosis_inter_token_seconds_count", tenant="acme", tier="flex") == 2
    assert moved("symbiosis_time_to_first_token_seconds_count", **ACME) == 0


def test_tokens_are_counted_against_the_tenants_own_targets(deployment: Deployment) -> None:
    """gamma asks a minute to its first token and 1 us between tokens (`GAMMA_TARGETS`): its
    first token meets its target, no gap does; acme, which set none, is counted against none."""

    def counted() -> dict:
        return {tuple(dict(labels)[k] for k in ("tenant", "target", "met")): value
                for (name, labels), value in scrape(deployment).items()
                if name == "symbiosis_token_targets_total"}

    before = counted()
    deployment.client("gamma").completions.create(model=MODEL, prompt=PROMPT, max_tokens=5,
                                                  temperature=0, seed=1)
    after = counted()

    def moved(*key: str) -> float:
        return after.get(key, 0) - before.get(key, 0)

    assert moved("gamma", "time_to_first_token", "true") == 1
    assert moved("gamma", "time_to_first_token", "false") == 0
    assert moved("gamma", "inter_token", "true") == 0
    assert moved("gamma", "inter_token", "false") == 4
    assert not any(tenant == "acme" for tenant, _, _ in after)
    usage = httpx.get(f"{deployment.stack.base_url}/dashboard/api/usage",
                      headers={"Authorization": f"Bearer {KEYS['gamma']}"}).json()
    assert (usage["time_to_first_token_target_met"], usage["inter_token_target_met"]) == (1, 0)
    acme = httpx.get(f"{deployment.stack.base_url}/dashboard/api/usage",
                     headers={"Authorization": f"Bearer {KEYS['acme']}"}).json()
    assert (acme["time_to_first_token_target_met"], acme["inter_token_target_met"]) == \
        (None, None)

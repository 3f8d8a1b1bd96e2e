"""Service tiers (`gateway/tiers.py`): a request at the flex tier (a client's `service_tier:
"flex"`, a Batch API line) reaches the worker manager marked so and without its tenant's
latency targets, and its answer names the tier that served it; a batch's lines run apart from
their tenant's interactive concurrency; the dashboard's mean token times are the default
tier's."""

from __future__ import annotations

import json
import time

from gateway.serving import PromptResult
from gateway.settings import GatewaySettings
from gateway.token_clock import TokenClock
from tests.gateway.conftest import KEY, serving
from tests.gateway.test_batches import request, until, upload
from tests.gateway.test_fan_out import completed, held_until
from tests.gateway.test_validation import assert_openai_error
from wire import manager as W
from wire.call import messages as P

HI = [{"role": "user", "content": "Hi"}]


def settings_of(tmp_path, **tenant) -> GatewaySettings:
    (tmp_path / "tenants.json").write_text(json.dumps({"tenants": [{"id": "acme", **tenant}]}))
    return GatewaySettings(data_dir=tmp_path, api_keys="acme=sk-acme",
                           manager=f"ipc://{tmp_path}/manager.sock", first_token_timeout_s=5)


def test_a_flex_request_goes_without_its_tenants_targets_and_names_its_tier(tmp_path) -> None:
    seen: list[W.Generate] = []

    def answer(message: W.Generate) -> list[W.Message]:
        seen.append(message)
        return completed(message)

    settings = settings_of(tmp_path, decode_target_ms=0.25, ttft_target_ms=900,
                           max_kv_tokens=200)  # room for one request: each gives it back
    with serving(settings) as (client, manager):
        manager.answer = answer
        chats = [client.post("/v1/chat/completions", headers=KEY, json={
            "model": "tiny-llama", "messages": HI, **({} if tier is None else {
                "service_tier": tier})}) for tier in (None, "auto", "default", "flex")]
        streamed = client.post("/v1/chat/completions", headers=KEY, json={
            "model": "tiny-llama", "messages": HI, "service_tier": "flex", "stream": True})
        responses = [client.post("/v1/responses", headers=KEY, json={
            "model": "tiny-llama", "input": "Hi", "service_tier": tier})
            for tier in ("flex", "default")]
        refused = client.post("/v1/responses", headers=KEY, json={
            "model": "tiny-llama", "input": "Hi", "service_tier": "priority"})
    assert [c.json()["service_tier"] for c in chats] == ["default"] * 3 + ["flex"]
    chunks = [json.loads(line[6:]) for line in streamed.text.splitlines()
              if line.startswith("data: {")]
    assert chunks and all(c["service_tier"] == "flex" for c in chunks)
    assert [r.json()["service_tier"] for r in responses] == ["flex", "default"]
    assert assert_openai_error(refused, 400)["param"] == "service_tier"
    assert [g.params.flex for g in seen] == [False] * 3 + [True, True, True, False]
    tenants = (P.CallTargets(250, 0), W.TokenTargets(900_000, 0))
    assert [(g.targets, g.token_targets) for g in seen] == [tenants] * 3 + [
        (P.NO_TARGETS, W.NO_TOKEN_TARGETS)] * 3 + [tenants]


def test_a_batchs_lines_run_at_flex_apart_from_the_tenants_concurrency(tmp_path) -> None:
    """Of a tenant that may have one request in flight, a batch's three lines are held at once
    by the stand-in manager, and an interactive request still has its slot beside them: none is
    answered until the four are in (before, each line took the one slot in turn: the stand-in
    never held more than one)."""
    seen: list[W.Generate] = []
    with serving(settings_of(tmp_path, max_concurrent=1)) as (client, manager):
        manager.answer = held_until(4, completed, seen)
        source = upload(client, [request(f"line-{i}", messages=HI) for i in range(3)]).json()
        batch = client.post("/v1/batches", headers=KEY, json={
            "input_file_id": source["id"], "endpoint": "/v1/chat/completions",
            "completion_window": "24h"}).json()
        deadline = time.monotonic() + 10
        while len(seen) < 3:
            assert time.monotonic() < deadline, seen
            time.sleep(0.02)
        interactive = client.post("/v1/chat/completions", headers=KEY,
                                  json={"model": "tiny-llama", "messages": HI})
        done = until(client, batch["id"], "completed")
        output = client.get(f"/v1/files/{done['output_file_id']}/content", headers=KEY).text
    assert interactive.status_code == 200, interactive.text
    assert interactive.json()["service_tier"] == "default"
    assert done["request_counts"] == {"total": 3, "completed": 3, "failed": 0}
    lines = [json.loads(line) for line in output.splitlines()]
    assert sorted(o["custom_id"] for o in lines) == ["line-0", "line-1", "line-2"]
    assert all(o["response"]["body"]["service_tier"] == "flex" for o in lines)
    assert [g.params.flex for g in seen] == [True, True, True, False]


def test_the_dashboards_mean_token_times_are_the_default_tiers(client) -> None:
    metrics = client.app.state.metrics
    for flex, seconds in ((False, 0.5), (True, 8.0), (False, 1.5)):
        clock = TokenClock(metrics, "acme", 0.0, W.SamplingParams(max_tokens=2, flex=flex),
                           clock=lambda at=seconds: at)
        clock.tick(PromptResult(0, W.Started("r-0", 3)), W.Delta("r-0", 0, "x"))
    usage = client.get("/dashboard/api/usage", headers=KEY).json()
    assert usage["mean_time_to_first_token_s"] == 1.0  # not 10 / 3 with the flex one's

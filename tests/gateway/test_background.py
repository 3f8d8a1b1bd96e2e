"""Background responses through the gateway, the manager's records behind it (its stand-in has
no workers: a generation finds the service unavailable, 503): the response is `queued` at once
and kept with its request; a run the service refuses is tried again and then settles `failed`
naming why; a cancel settles it `cancelled` and stops its run, and is refused for a response
that ended otherwise or never ran in the background; a gateway that starts runs again the
pending ones a stopped one left."""

from __future__ import annotations

import json
import time

import pytest

from gateway import background
from gateway.settings import GatewaySettings
from gateway.stored import keep
from gateway.tenants import Tenant
from tests.gateway.conftest import KEY, serving
from tests.gateway.test_stored import ID, made
from tests.gateway.test_validation import assert_openai_error
from tests.workers.manager.test_response_store import REQUEST, queued
from workers.manager.records import Records

BETA = {"Authorization": "Bearer sk-beta"}
ASK = {"model": "tiny-llama", "input": "Hi", "background": True, "max_output_tokens": 5,
       "metadata": {"k": "v"}}


def create(client, **fields):
    return client.post("/v1/responses", headers=KEY, json=ASK | fields)


def settled(client, response_id: str, timeout_s: float = 20.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        body = client.get(f"/v1/responses/{response_id}", headers=KEY).json()
        if body["status"] not in ("queued", "in_progress") or time.monotonic() > deadline:
            return body
        time.sleep(0.05)


def test_a_response_is_queued_at_once_and_fails_naming_why_after_its_tries(
        managed, monkeypatch) -> None:
    monkeypatch.setattr(background, "UNAVAILABLE_TRIES", 1)  # tried again once, 1 s later
    client, _ = managed
    answer = create(client)
    assert answer.status_code == 200, answer.text
    made_ = answer.json()
    assert (made_["status"], made_["background"], made_["store"], made_["output"],
            made_["metadata"]) == ("queued", True, True, [], {"k": "v"})
    kept = client.app.state.responses.get(made_["id"], "acme")
    assert kept.request == ASK and kept.input_items[0]["content"][0]["text"] == "Hi"
    started = time.monotonic()
    failed = settled(client, made_["id"])
    assert failed["status"] == "failed" and time.monotonic() - started >= 1.0
    assert failed["error"]["code"] == "server_error" and failed["error"]["message"]
    assert {k: v for k, v in failed.items() if k not in ("status", "error")} == \
        {k: v for k, v in made_.items() if k not in ("status", "error")}
    refused = assert_openai_error(
        client.post(f"/v1/responses/{made_['id']}/cancel", headers=KEY), 409)
    assert refused["param"] == "response_id" and "failed" in refused["message"]
    assert client.app.state.responses.pending() == []


def test_a_run_that_breaks_inside_the_server_fails_not_left_pending(managed,
                                                                    monkeypatch) -> None:
    client, _ = managed

    async def broken(*args, **kwargs):
        raise RuntimeError("a bug in serving")

    monkeypatch.setattr(client.app.state.serving, "start", broken)  # the fault injected
    failed = settled(client, create(client).json()["id"])
    assert failed["status"] == "failed" and failed["error"]["code"] == "server_error"
    assert client.app.state.responses.pending() == []
    assert ended(client, "failed") == 1


def ended(client, status: str) -> float:
    """How many of acme's background responses' runs ended so (`/metrics`)."""
    return client.app.state.metrics.background.labels("acme", status)._value.get()


def test_a_tenants_responses_run_a_few_at_a_time_in_order(managed, monkeypatch,
                                                          caplog) -> None:
    monkeypatch.setattr(background, "PARALLEL", 2)
    monkeypatch.setattr(background, "UNAVAILABLE_TRIES", 1)  # each run takes 1 s to fail
    client, _ = managed
    caplog.set_level("INFO", logger="gateway.background")
    ids = [create(client).json()["id"] for _ in range(4)]

    def ran() -> list[str]:
        return [r.args[0] for r in caplog.records if r.getMessage().endswith(" runs")]

    deadline = time.monotonic() + 5
    while len(ran()) < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert ran() == ids[:2]  # the others wait their turn: the first two take 1 s each
    assert [settled(client, i)["status"] for i in ids] == ["failed"] * 4
    assert ran() == ids


def test_a_cancel_stops_its_run_and_holds(managed) -> None:
    client, _ = managed
    made_ = create(client).json()  # its run waits 1, 2, 4 ... s between tries
    assert client.get(f"/v1/responses/{made_['id']}", headers=KEY).json()["status"] == \
        "queued"
    assert_openai_error(client.post(f"/v1/responses/{made_['id']}/cancel", headers=BETA), 404)
    cancelled = client.post(f"/v1/responses/{made_['id']}/cancel", headers=KEY)
    assert cancelled.status_code == 200, cancelled.text
    assert cancelled.json() == made_ | {"status": "cancelled"}
    deadline = time.monotonic() + 5
    while made_["id"] in client.app.state.background.running and time.monotonic() < deadline:
        time.sleep(0.02)
    assert made_["id"] not in client.app.state.background.running  # its run stopped
    assert ended(client, "cancelled") == 1
    again = client.post(f"/v1/responses/{made_['id']}/cancel", headers=KEY)
    assert again.status_code == 200 and again.json()["status"] == "cancelled"
    assert client.get(f"/v1/responses/{made_['id']}", headers=KEY).json()["status"] == \
        "cancelled"


def test_what_cannot_be_cancelled_or_gone_on_from_is_refused(managed) -> None:
    client, _ = managed
    assert client.portal.call(keep, client.app.state.manager, Tenant("acme"), made(), [], [])
    foreground = assert_openai_error(
        client.post(f"/v1/responses/{ID}/cancel", headers=KEY), 400)
    assert "background=true" in foreground["message"]
    assert_openai_error(client.post(f"/v1/responses/resp_{'0' * 32}/cancel", headers=KEY), 404)
    pending = create(client).json()
    refused = assert_openai_error(create(client, previous_response_id=pending["id"],
                                         background=False), 400)
    assert refused["param"] == "previous_response_id" and "queued" in refused["message"]
    assert assert_openai_error(create(client, store=False), 400)["param"] == "store"
    assert assert_openai_error(create(client, temperature=3), 400)["param"] == "temperature"
    deleted = client.delete(f"/v1/responses/{pending['id']}", headers=KEY)
    assert deleted.status_code == 200
    deadline = time.monotonic() + 5
    while pending["id"] in client.app.state.background.running and \
            time.monotonic() < deadline:
        time.sleep(0.02)
    assert pending["id"] not in client.app.state.background.running  # a delete stops it
    assert ended(client, "deleted") == 1
    assert len(client.app.state.responses.pending()) == 0


def test_a_streamed_one_sends_its_events_and_sends_them_again(managed, monkeypatch) -> None:
    monkeypatch.setattr(background, "UNAVAILABLE_TRIES", 0)  # it fails at once: no workers
    client, _ = managed
    with client.stream("POST", "/v1/responses", headers=KEY, json=ASK | {"stream": True}) as sent:
        assert sent.status_code == 200
        assert sent.headers["content-type"].startswith("text/event-stream")
        blocks = b"".join(sent.iter_bytes()).decode().strip().split("\n\n")
    events = [json.loads(b.split("data: ")[1]) for b in blocks]
    assert [(b.split("\n")[0], e["sequence_number"])
            for b, e in zip(blocks, events, strict=True)] == [
        ("event: response.created", 0), ("event: response.queued", 1),
        ("event: response.failed", 2)]
    assert events[0]["response"]["status"] == events[1]["response"]["status"] == "queued"
    failed = events[2]
    assert failed["response"]["status"] == "failed"
    assert failed["response"]["error"]["code"] == "server_error"
    response_id = failed["response"]["id"]
    assert client.get(f"/v1/responses/{response_id}", headers=KEY).json() == failed["response"]
    again = client.get(f"/v1/responses/{response_id}?stream=true", headers=KEY)
    assert again.text.strip().split("\n\n") == blocks
    past = client.get(f"/v1/responses/{response_id}?stream=true&starting_after=1", headers=KEY)
    assert past.text.strip() == blocks[2]
    polled = create(client).json()
    refused = assert_openai_error(
        client.get(f"/v1/responses/{polled['id']}?stream=true", headers=KEY), 400)
    assert refused["param"] == "stream" and "stream=true" in refused["message"]
    client.app.state.background.events.clear()  # as once KEPT_S passed
    gone = assert_openai_error(
        client.get(f"/v1/responses/{response_id}?stream=true", headers=KEY), 400)
    assert "no longer kept" in gone["message"]


def test_a_background_response_past_the_storage_quota_is_refused(tmp_path) -> None:
    settings = GatewaySettings(data_dir=tmp_path, api_keys="acme=sk-acme",
                               manager=f"ipc://{tmp_path}/manager.sock",
                               max_storage_mb=100 / 2**20)
    with serving(settings) as (client, _):
        refused = assert_openai_error(create(client), 403)
        assert refused["code"] == "storage_quota_exceeded"
        assert client.app.state.responses.pending() == []


def test_pending_responses_a_stopped_gateway_left_run_on_the_next(tmp_path,
                                                                   monkeypatch) -> None:
    monkeypatch.setattr(background, "UNAVAILABLE_TRIES", 0)
    records = Records(tmp_path, "tiny-llama", "tcp://*:5999")
    queued(records)  # queued by a gateway that stopped before running it
    records.close()
    settings = GatewaySettings(data_dir=tmp_path, api_keys="acme=sk-acme",
                               manager=f"ipc://{tmp_path}/manager.sock")
    with serving(settings) as (client, _):
        failed = settled(client, f"resp_{'e' * 32}")
        assert failed["status"] == "failed", failed  # it ran: the service had no worker
        assert failed["error"] == {"code": "server_error",
                                   "message": "no workers behind this stand-in manager"}
        assert failed["model"] == REQUEST["model"] and failed["background"]


def test_a_request_refused_when_it_runs_fails_naming_why(tmp_path) -> None:
    records = Records(tmp_path, "tiny-llama", "tcp://*:5999")
    queued(records, request=REQUEST | {"model": "acme/gone"})  # its adapter deleted since
    records.close()
    settings = GatewaySettings(data_dir=tmp_path, api_keys="acme=sk-acme",
                               manager=f"ipc://{tmp_path}/manager.sock")
    with serving(settings) as (client, _):
        failed = settled(client, f"resp_{'e' * 32}")
        assert failed["status"] == "failed" and failed["error"]["code"] == "invalid_prompt"
        assert "acme/gone" in failed["error"]["message"]


@pytest.mark.parametrize("status", ["completed", "cancelled"])
def test_a_settled_response_is_not_run_again(tmp_path, status: str) -> None:
    from tests.workers.manager.test_response_store import settle

    records = Records(tmp_path, "tiny-llama", "tcp://*:5999")
    queued(records)
    assert settle(records, status).made
    records.close()
    settings = GatewaySettings(data_dir=tmp_path, api_keys="acme=sk-acme",
                               manager=f"ipc://{tmp_path}/manager.sock")
    with serving(settings) as (client, _):
        assert client.app.state.background.running == {}
        assert client.get(f"/v1/responses/resp_{'e' * 32}", headers=KEY).json()["status"] == \
            status

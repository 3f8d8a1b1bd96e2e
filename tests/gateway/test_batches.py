"""/v1/batches through the gateway with the manager's records behind it: a batch file is
checked at upload and a batch at creation (each fault an OpenAI-shaped 400 naming its field);
a batch left running by a gateway that stopped is run on from where it was by the next one, its
requests answered in process as its tenant, exactly as the endpoint answers them, as many at once
as its worker's flex seats."""

from __future__ import annotations

import asyncio
import json
import time
import uuid

import pytest

from gateway import in_process
from gateway.settings import GatewaySettings
from tests.gateway.conftest import KEY, serving
from tests.gateway.test_validation import assert_openai_error
from tests.workers.manager.test_store_desk import act
from wire.store import StoreAction
from workers.manager.records import Records

URL = "/v1/chat/completions"


def upload(client, rows: list[dict], purpose: str = "batch"):
    data = "\n".join(json.dumps(r) for r in rows).encode()
    return client.post("/v1/files", headers=KEY, data={"purpose": purpose},
                       files={"file": ("in.jsonl", data, "application/jsonl")})


def request(custom_id: str, **body) -> dict:
    return {"custom_id": custom_id, "method": "POST", "url": URL,
            "body": {"model": "tiny-llama", **body}}


def test_a_batch_file_and_a_batch_are_checked_naming_what_is_wrong(client) -> None:
    bad = upload(client, [request("a", messages=[]), request("a", messages=[])])
    assert "Line 2: custom_id 'a' is not unique" in assert_openai_error(bad, 400)["message"]
    good = upload(client, [request("a", messages=[])]).json()
    assert good["purpose"] == "batch"
    tuning = client.post("/v1/files", headers=KEY, data={"purpose": "fine-tune"}, files={
        "file": ("t.jsonl", b"\n".join([json.dumps({"prompt": "a", "completion": "b"}).encode()]
                                        * 10), "application/jsonl")})
    assert tuning.status_code == 200, tuning.text

    def create(**fields):
        return client.post("/v1/batches", headers=KEY, json={
            "input_file_id": good["id"], "endpoint": URL, "completion_window": "24h", **fields})

    assert assert_openai_error(create(endpoint="/v1/completions"), 400)["param"] == "endpoint"
    assert assert_openai_error(create(input_file_id="file-none"), 404)["param"] == \
        "input_file_id"
    assert assert_openai_error(create(input_file_id=tuning.json()["id"]), 400)["param"] == \
        "input_file_id"
    assert assert_openai_error(create(completion_window="1h"), 400)["param"] == \
        "completion_window"
    short = create(output_expires_after={"anchor": "created_at", "seconds": 60})
    assert assert_openai_error(short, 400)["param"] == "output_expires_after.seconds"
    assert client.get("/v1/batches", headers=KEY).json()["data"] == []
    assert assert_openai_error(client.get("/v1/batches/batch_x", headers=KEY), 404)["code"] == \
        "batch_not_found"


def running(records: Records, rows: list[dict]) -> tuple[str, str]:
    """A batch of `rows` in progress: its id and its input file's."""
    source = records.files.create("acme", "in.jsonl", "batch",
                                  "\n".join(json.dumps(r) for r in rows).encode())
    batch_id = f"batch_{uuid.uuid4().hex}"
    assert act(records, StoreAction.ADD_BATCH, record=json.dumps(
        {"id": batch_id, "endpoint": URL, "input_file_id": source.id, "total": len(rows),
         "output_expires_s": 7200})).ok
    return batch_id, source.id


@pytest.fixture()
def left_running(tmp_path) -> tuple[str, str]:
    """A batch of five requests, the first answered by a gateway that then stopped."""
    records = Records(tmp_path, "tiny-llama", "")
    rows = [request("kept", messages=[{"role": "user", "content": "Hi"}]),
            request("empty", messages=[]), request("streamed", stream=True, messages=[
                {"role": "user", "content": "Hi"}]),
            request("theirs", messages=[{"role": "user", "content": "Hi"}]) | {
                "body": {"model": "beta/x", "messages": [{"role": "user", "content": "Hi"}]}},
            request("background", background=True, messages=[{"role": "user", "content": "Hi"}])]
    batch_id, source = running(records, rows)
    assert act(records, StoreAction.BATCH_RESULT, record=json.dumps(
        {"batch_id": batch_id, "line": 0, "custom_id": "kept", "response": {
            "status_code": 200, "request_id": "r0", "body": {"answered": "before"}}})).made
    records.close()
    return batch_id, source


def until(client, batch_id: str, status: str) -> dict:
    """The batch once its gateway has run it to `status`."""
    deadline = time.monotonic() + 30
    while (batch := client.get(f"/v1/batches/{batch_id}", headers=KEY).json())[
            "status"] != status:
        assert time.monotonic() < deadline, batch
        time.sleep(0.1)
    return batch


def test_a_batch_left_running_goes_on_where_it_was(tmp_path, left_running) -> None:
    batch_id, source = left_running
    settings = GatewaySettings(data_dir=tmp_path, api_keys="acme=sk-acme,beta=sk-beta",
                               manager=f"ipc://{tmp_path}/manager.sock")
    with serving(settings) as (client, _):
        batch = until(client, batch_id, "completed")
        assert batch["request_counts"] == {"total": 5, "completed": 1, "failed": 4}
        assert batch["input_file_id"] == source

        def lines(file_id: str) -> list[dict]:
            text = client.get(f"/v1/files/{file_id}/content", headers=KEY).text
            return [json.loads(line) for line in text.splitlines()]

        assert [(o["custom_id"], o["response"]["body"]) for o in
                lines(batch["output_file_id"])] == [("kept", {"answered": "before"})]
        for file_id in (batch["output_file_id"], batch["error_file_id"]):
            made = client.get(f"/v1/files/{file_id}", headers=KEY).json()
            assert made["expires_at"] == made["created_at"] + 7200  # output_expires_after
        errors = {e["custom_id"]: e["response"] for e in lines(batch["error_file_id"])}
        assert list(errors) == ["empty", "streamed", "theirs", "background"]  # input's order
        assert {k: (r["status_code"], r["body"]["error"]["param"]) for k, r in errors.items()} \
            == {"empty": (400, "messages"), "streamed": (400, "stream"),
                "theirs": (404, "model"),  # answered as acme: beta's model is not acme's
                "background": (400, "background")}
        assert all(len(r["request_id"]) == 32 for k, r in errors.items()
                   if k not in ("streamed", "background"))
        assert client.get("/v1/batches", headers=KEY).json()["data"][0]["id"] == batch_id
        beta = {"Authorization": "Bearer sk-beta"}
        assert client.get(f"/v1/batches/{batch_id}", headers=beta).status_code == 404
        metrics = client.app.state.metrics.batch_requests
        assert metrics.labels("acme", "400")._value.get() == 1  # streamed, background: not run
        assert metrics.labels("acme", "404")._value.get() == 1


def test_a_batch_past_its_window_expires_naming_the_requests_it_never_ran(
        tmp_path, left_running) -> None:
    batch_id, _ = left_running
    records = Records(tmp_path, "tiny-llama", "")
    body = records.batches.get(batch_id, "acme").body
    body["expires_at"] = body["created_at"] - 1  # its 24 h have passed
    with records.db.transaction() as conn:
        conn.execute("UPDATE batches SET body = ? WHERE id = ?", (json.dumps(body), batch_id))
    records.close()
    settings = GatewaySettings(data_dir=tmp_path, api_keys="acme=sk-acme",
                               manager=f"ipc://{tmp_path}/manager.sock")
    with serving(settings) as (client, _):
        batch = until(client, batch_id, "expired")
        assert batch["expired_at"] >= batch["expires_at"]
        errors = client.get(f"/v1/files/{batch['error_file_id']}/content", headers=KEY).text
        assert [(e["custom_id"], e["error"]["code"]) for e in map(json.loads,
                                                                  errors.splitlines())] == \
            [("empty", "batch_expired"), ("streamed", "batch_expired"),
             ("theirs", "batch_expired"), ("background", "batch_expired")]
        assert batch["request_counts"] == {"total": 5, "completed": 1, "failed": 0}


@pytest.mark.parametrize(("max_batch", "at_once"), [(8, 6), (None, 24)])
def test_a_tenants_batch_lines_run_as_many_at_once_as_its_workers_flex_seats(
        tmp_path, monkeypatch, max_batch: int | None, at_once: int) -> None:
    """A worker of `max_batch` seats (32 unless configured) gives flex requests three quarters
    of them, and a step decodes them together: a tenant's batch keeps that many lines in flight
    (8, whatever the worker, before), each answered here by a stand-in for the endpoint."""
    in_flight, most = 0, 0

    async def answered(app, tenant: str, path: str, data: bytes, **kw):
        nonlocal in_flight, most
        in_flight += 1
        most = max(most, in_flight)
        await asyncio.sleep(0.05)
        in_flight -= 1
        return 200, {"x-request-id": "r"}, json.dumps({"line": json.loads(data)["n"]}).encode()

    monkeypatch.setattr(in_process, "post", answered)
    records = Records(tmp_path, "tiny-llama", "")
    batch_id, _ = running(records, [request(f"c{k}", n=k) for k in range(at_once + 9)])
    records.close()
    configured = {"max_batch": max_batch} if max_batch else {}
    settings = GatewaySettings(data_dir=tmp_path, api_keys="acme=sk-acme",
                               manager=f"ipc://{tmp_path}/manager.sock", **configured)
    with serving(settings) as (client, _):
        batch = until(client, batch_id, "completed")
        output = client.get(f"/v1/files/{batch['output_file_id']}/content", headers=KEY).text
    assert most == at_once
    assert [json.loads(o)["response"]["body"]["line"] for o in output.splitlines()] == \
        list(range(at_once + 9))

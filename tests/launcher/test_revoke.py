"""`symbiosis tenants revoke NAME` stops the tenant's work: its unfinished fine-tuning jobs,
running batches and pending background responses are cancelled through the running worker
manager (a running job's trainer stops first) or, with none running, as the data dir's writer;
finished jobs and other tenants' work stay as they were."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid

from gateway.job_spec import resolve
from gateway.tenants import TenantDirectory, create_tenant
from launcher.revoke import cancel_work
from openapi.fine_tuning import Hyperparameters
from state.jobs import new_id
from tests.gateway.conftest import managed
from tests.gateway.test_files import ROW
from tests.workers.manager.test_response_store import queued as queued_response
from wire.jobs import NewJob
from workers.manager.records import Records

__all__ = ["managed"]  # the fixture
ACME = {"Authorization": "Bearer sk-acme"}
BETA = {"Authorization": "Bearer sk-beta"}
TRAINING = b"\n".join([ROW] * 10)  # the fewest examples a job takes
ACME_RESPONSE, BETA_RESPONSE = f"resp_{'a' * 32}", f"resp_{'b' * 32}"


def test_revoking_cancels_the_tenants_jobs_through_the_running_manager(managed, tmp_path) -> None:
    client, _ = managed  # one job slot: acme's first job runs, the others wait

    def job(headers: dict) -> str:
        made = client.post("/v1/files", headers=headers, data={"purpose": "fine-tune"},
                           files={"file": ("t.jsonl", TRAINING, "application/jsonl")}).json()
        created = client.post("/v1/fine_tuning/jobs", headers=headers,
                              json={"model": "tiny-llama", "training_file": made["id"]})
        assert created.status_code == 200, created.text
        return created.json()["id"]

    running, queued, paused, other = job(ACME), job(ACME), job(ACME), job(BETA)
    pause = client.post(f"/v1/fine_tuning/jobs/{paused}/pause", headers=ACME)
    assert pause.status_code == 200, pause.text

    def status(job_id: str, headers: dict = ACME) -> str:
        return client.get(f"/v1/fine_tuning/jobs/{job_id}", headers=headers).json()["status"]

    assert [status(j) for j in (running, queued, paused)] == ["running", "queued", "paused"]
    batch = client.post("/v1/batches", headers=ACME, json={
        "input_file_id": batch_file(client), "endpoint": "/v1/chat/completions",
        "completion_window": "24h"}).json()  # its request waits: no workers behind the stand-in
    ask = {"model": "tiny-llama", "input": "Hi", "background": True}
    response = client.post("/v1/responses", headers=ACME, json=ask).json()  # waits too
    others = client.post("/v1/responses", headers=BETA, json=ask).json()
    assert sorted(cancel_work(tmp_path, "acme")) == \
        sorted([running, queued, paused, batch["id"], response["id"]])
    assert client.get(f"/v1/responses/{response['id']}", headers=ACME).json()["status"] == \
        "cancelled"
    assert client.get(f"/v1/responses/{others['id']}", headers=BETA).json()["status"] == \
        "queued"
    assert [status(j) for j in (running, queued, paused)] == ["cancelled"] * 3
    assert status(other, BETA) in ("queued", "running")  # beta's goes on: the slot is free
    deadline = time.monotonic() + 30
    while client.get(f"/v1/batches/{batch['id']}", headers=ACME).json()["status"] != "cancelled":
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert cancel_work(tmp_path, "acme") == []


def batch_file(client) -> str:
    row = {"custom_id": "a", "method": "POST", "url": "/v1/chat/completions",
           "body": {"model": "tiny-llama", "messages": [{"role": "user", "content": "Hi"}]}}
    made = client.post("/v1/files", headers=ACME, data={"purpose": "batch"},
                       files={"file": ("in.jsonl", json.dumps(row).encode(), "application/jsonl")})
    return made.json()["id"]


def test_the_cli_revokes_the_keys_and_cancels_unfinished_jobs_with_no_manager(tmp_path) -> None:
    data_dir = tmp_path / "data"
    tenants = data_dir / "tenants.json"
    create_tenant(tenants, "acme")
    create_tenant(tenants, "beta")
    records = Records(data_dir, "tiny-llama", "")
    upload_file = records.files.create("acme", "t.jsonl", "fine-tune", ROW, examples=1)
    spec = resolve(Hyperparameters(n_epochs=1), {"method": "lora"}, 1, 0)
    ids = {}
    for name, tenant, moves in (("queued", "acme", ["queued"]),
                                ("left running", "acme", ["queued", "running"]),
                                ("done", "acme", ["queued", "running", "succeeded"]),
                                ("beta's", "beta", ["queued"])):
        ids[name] = records.jobs.create(new_id("ftjob"), NewJob(
            tenant=tenant, model="tiny-llama", training_file=upload_file.id, seed=1,
            spec=spec)).id
        assert all(records.jobs.move(ids[name], status) for status in moves)
    rows = json.dumps({"custom_id": "a", "method": "POST", "url": "/v1/completions",
                       "body": {}}).encode()
    for tenant in ("acme", "beta"):
        source = records.files.create(tenant, "in.jsonl", "batch", rows)
        ids[f"{tenant}'s batch"] = records.batches.add(tenant, json.dumps(
            {"id": f"batch_{uuid.uuid4().hex}", "endpoint": "/v1/completions",
             "input_file_id": source.id, "total": 1}))
    queued_response(records, ACME_RESPONSE)
    queued_response(records, BETA_RESPONSE, "beta")
    records.close()
    out = subprocess.run([sys.executable, "-m", "launcher.cli", "tenants", "revoke", "acme",
                          "--data-dir", str(data_dir)], capture_output=True, text=True, check=True)
    assert "revoked" in out.stdout and ids["queued"] in out.stdout and \
        ids["left running"] in out.stdout and ids["acme's batch"] in out.stdout and \
        ACME_RESPONSE in out.stdout and ids["done"] not in out.stdout
    records = Records(data_dir, "tiny-llama", "")
    try:
        assert {name: records.jobs.get(job_id).status for name, job_id in ids.items()
                if "batch" not in name} == {"queued": "cancelled", "left running": "cancelled",
                                            "done": "succeeded", "beta's": "queued"}
        assert records.batches.get(ids["acme's batch"], "acme").status == "cancelling"
        assert records.batches.get(ids["beta's batch"], "beta").status == "in_progress"
        assert records.responses.get(ACME_RESPONSE, "acme").body["status"] == "cancelled"
        assert records.responses.get(BETA_RESPONSE, "beta").body["status"] == "queued"
        events = records.jobs.events(ids["queued"], after=None, limit=10)[0]
        assert events[0]["message"] == "Job cancelled: its tenant was revoked"
    finally:
        records.close()
    assert set(TenantDirectory.load(tenants).tenants) == {"beta"}

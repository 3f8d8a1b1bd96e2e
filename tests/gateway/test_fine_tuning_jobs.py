"""Fine-tuning jobs through the gateway, with the manager's job queue behind it: which models
may start one (and cannot be deleted while it runs), bounds, the priority a job gets; the
gateway never writes a job, and without the manager it creates none."""

from __future__ import annotations

import json
import sqlite3

import pytest
from fastapi.testclient import TestClient

from catalogue.resolve import resolve_model
from gateway.app import create_app
from gateway.settings import GatewaySettings
from gateway.tenants import hash_key
from tests.e2e.adapters import save_adapter
from tests.gateway.conftest import KEY, wait_until_up
from tests.gateway.manager_stand_in import ManagerStandIn
from tests.gateway.test_validation import assert_openai_error
from tests.workers.training.test_trainer import gsm8k
from workers.manager.records import Records


def upload(client, headers: dict = KEY) -> str:
    data = "\n".join(json.dumps(r) for r in gsm8k(10)).encode()
    response = client.post("/v1/files", headers=headers, data={"purpose": "fine-tune"},
                           files={"file": ("train.jsonl", data, "application/jsonl")})
    assert response.status_code == 200, response.text
    return response.json()["id"]


def test_a_job_continues_a_model_of_its_tenant_only(managed, tmp_path) -> None:
    client, manager = managed
    registry = manager.registry  # the records' writer
    registry.register("acme", "memo", save_adapter(tmp_path / "memo", "lora", 1))
    registry.register("beta", "theirs", save_adapter(tmp_path / "theirs", "lora", 2))
    training = upload(client)
    job = {"training_file": training, "method": {"type": "supervised"}}
    error = assert_openai_error(client.post("/v1/fine_tuning/jobs", headers=KEY, json={
        **job, "model": "beta/theirs"}), 404)
    assert error["param"] == "model"
    for missing in ("acme/memo@2", "acme/memo@0"):
        assert_openai_error(client.post("/v1/fine_tuning/jobs", headers=KEY, json={
            **job, "model": missing}), 404)
    error = assert_openai_error(client.post("/v1/fine_tuning/jobs", headers=KEY, json={
        **job, "model": "acme/memo", "peft": {"method": "ia3"}}), 400)
    assert error["param"] == "peft.method" and "lora" in error["message"]
    created = client.post("/v1/fine_tuning/jobs", headers=KEY, json={**job, "model": "acme/memo"})
    assert created.status_code == 200, created.text
    body = created.json()
    assert body["model"] == body["peft"]["init_model"] == "acme/memo@1"  # the version it continues
    assert body["peft"]["method"] == "lora" and "init_adapter" not in body["peft"]
    for path in ("/v1/models/acme/memo", "/v1/adapters/acme/memo/versions/1"):
        error = assert_openai_error(client.delete(path, headers=KEY), 409)
        assert error["code"] == "model_in_use" and body["id"] in error["message"]
    cancelled = client.post(f"/v1/fine_tuning/jobs/{body['id']}/cancel", headers=KEY)
    assert cancelled.json()["status"] == "cancelled", cancelled.text
    assert client.delete("/v1/models/acme/memo", headers=KEY).json()["deleted"] is True


def test_held_out_gate_texts_are_bounded(managed) -> None:
    client, _ = managed
    training = upload(client)
    error = assert_openai_error(client.post("/v1/fine_tuning/jobs", headers=KEY, json={
        "model": "tiny-llama", "training_file": training,
        "gates": {"held_out": [{"prompt": "Q", "completion": "A" * 2000}]}}), 400)
    assert error["param"] == "gates.held_out.0.completion"


@pytest.mark.parametrize(("peft", "param", "named"), [
    ({"target_modules": ["q_prj"]}, "peft.target_modules", "q_prj"),
    ({"target_modules": ["q_proj", "nope"]}, "peft.target_modules", "nope"),
    ({"method": "ia3", "target_modules": ["down_proj"], "feedforward_modules": ["mlp.down"]},
     "peft.feedforward_modules", "mlp.down"),
])
def test_a_target_module_the_model_lacks_is_refused_naming_it(managed, peft, param,
                                                              named) -> None:
    resolve_model("tiny-llama")  # the gateway reads the modules' names from its files
    client, _ = managed
    error = assert_openai_error(client.post("/v1/fine_tuning/jobs", headers=KEY, json={
        "model": "tiny-llama", "training_file": upload(client), "peft": peft}), 400)
    assert error["param"] == param and f"names '{named}', which is no module" in error["message"]
    assert "q_proj" in error["message"]  # what the model's modules are called
    assert client.get("/v1/fine_tuning/jobs", headers=KEY).json()["data"] == []


@pytest.mark.parametrize("targets", [["all-linear"], ["self_attn.q_proj", "v_proj"]])
def test_targets_peft_matches_are_taken(managed, targets) -> None:
    resolve_model("tiny-llama")
    client, _ = managed
    created = client.post("/v1/fine_tuning/jobs", headers=KEY, json={
        "model": "tiny-llama", "training_file": upload(client),
        "peft": {"target_modules": targets}})
    assert created.status_code == 200, created.text
    assert created.json()["peft"]["target_modules"] == targets


def test_a_jobs_priority_defaults_to_its_tenants_tier(tmp_path) -> None:
    (tmp_path / "tenants.json").write_text(json.dumps({"tenants": [
        {"id": "gold", "key_sha256": [hash_key("sk-gold")], "job_priority": 50}]}))
    endpoint = f"ipc://{tmp_path}/manager.sock"
    settings = GatewaySettings(data_dir=tmp_path, api_keys="acme=sk-acme", manager=endpoint)
    with TestClient(create_app(settings)) as app:
        manager = ManagerStandIn(tmp_path, endpoint)
        wait_until_up(app)
        priorities = {}
        for key, extra in (("sk-gold", {}), ("sk-gold", {"priority": -5}), ("sk-acme", {})):
            headers = {"Authorization": f"Bearer {key}"}
            job = app.post("/v1/fine_tuning/jobs", headers=headers, json={
                "model": "tiny-llama", "training_file": upload(app, headers), **extra})
            assert job.status_code == 200, job.text
            priorities[(key, extra.get("priority"))] = job.json()["priority"]
        manager.close()
    assert priorities == {("sk-gold", None): 50, ("sk-gold", -5): -5, ("sk-acme", None): 0}


def test_hyperparameters_out_of_bounds_are_refused_by_the_api_model(managed) -> None:
    """The bounds live in `openapi.fine_tuning.Hyperparameters` alone; each refusal names its
    field, and an accepted job shows what `resolve` made of "auto"."""
    client, _ = managed
    training = upload(client)
    job = {"model": "tiny-llama", "training_file": training}
    for field, value in (("n_epochs", 0), ("n_epochs", 51), ("batch_size", 257),
                         ("learning_rate_multiplier", 0), ("learning_rate_multiplier", -1.5)):
        error = assert_openai_error(client.post("/v1/fine_tuning/jobs", headers=KEY, json={
            **job, "hyperparameters": {field: value}}), 400)
        assert error["param"] == f"hyperparameters.{field}", error
    created = client.post("/v1/fine_tuning/jobs", headers=KEY, json={
        **job, "hyperparameters": {"n_epochs": 50, "learning_rate_multiplier": 0.5}})
    assert created.status_code == 200, created.text
    assert created.json()["hyperparameters"] == {"n_epochs": 50, "batch_size": 1,
                                                 "learning_rate_multiplier": 0.5}
    assert created.json()["peft"]["learning_rate"] == 1e-4  # lora's 2e-4 x 0.5


def test_hyperparameters_given_twice_must_agree(managed) -> None:
    """The deprecated top-level `hyperparameters` beside method's: the same values are one
    request, different ones a 400 (one was silently dropped)."""
    client, _ = managed
    job = {"model": "tiny-llama", "training_file": upload(client)}

    def method(n_epochs: int) -> dict:
        return {"type": "supervised", "supervised": {"hyperparameters": {"n_epochs": n_epochs}}}

    error = assert_openai_error(client.post("/v1/fine_tuning/jobs", headers=KEY, json={
        **job, "hyperparameters": {"n_epochs": 1}, "method": method(2)}), 400)
    assert error["param"] == "hyperparameters" and "given twice" in error["message"]
    same = client.post("/v1/fine_tuning/jobs", headers=KEY, json={
        **job, "hyperparameters": {"n_epochs": 2}, "method": method(2)})
    assert same.status_code == 200 and same.json()["hyperparameters"]["n_epochs"] == 2


def test_gradient_checkpointing_is_stored_and_refused_with_prefix_tuning(managed) -> None:
    client, _ = managed
    job = {"model": "tiny-llama", "training_file": upload(client)}
    error = assert_openai_error(client.post("/v1/fine_tuning/jobs", headers=KEY, json={
        **job, "peft": {"method": "prefix_tuning", "gradient_checkpointing": True}}), 400)
    assert error["param"] == "peft.gradient_checkpointing" and "prefix" in error["message"]
    created = client.post("/v1/fine_tuning/jobs", headers=KEY, json={
        **job, "peft": {"method": "prompt_tuning", "gradient_checkpointing": True}})
    assert created.status_code == 200, created.text
    assert created.json()["peft"]["gradient_checkpointing"] is True
    plain = client.post("/v1/fine_tuning/jobs", headers=KEY, json=job).json()
    assert plain["peft"]["gradient_checkpointing"] is False


def test_an_integration_nothing_here_can_reach_is_refused_not_ignored(managed) -> None:
    client, _ = managed
    job = {"model": "tiny-llama", "training_file": upload(client)}
    wandb = {"type": "wandb", "wandb": {"project": "my-wandb-project", "tags": ["v2"]}}
    error = assert_openai_error(client.post("/v1/fine_tuning/jobs", headers=KEY, json={
        **job, "integrations": [wandb]}), 400)
    assert error["param"] == "integrations" and error["code"] == "unsupported_parameter"
    assert "Weights & Biases" in error["message"]
    assert client.get("/v1/fine_tuning/jobs", headers=KEY).json()["data"] == []  # none stored
    created = client.post("/v1/fine_tuning/jobs", headers=KEY, json={**job, "integrations": []})
    assert created.status_code == 200, created.text
    assert created.json()["integrations"] == []


def test_the_gateway_never_writes_a_job_and_the_manager_moves_them(managed) -> None:
    """Every write through the gateway's own connections (one a thread) is refused by SQLite
    (query_only); creating, pausing, resuming and cancelling all work."""
    client, manager = managed
    training = upload(client)

    def act(job_id: str, action: str, status: int = 200) -> dict:
        response = client.post(f"/v1/fine_tuning/jobs/{job_id}/{action}", headers=KEY)
        assert response.status_code == status, response.text
        return response.json()

    first, second = (client.post("/v1/fine_tuning/jobs", headers=KEY, json={
        "model": "tiny-llama", "training_file": training}).json() for _ in range(2))
    assert (first["status"], second["status"]) == ("running", "queued")  # one slot
    assert act(second["id"], "pause")["status"] == "paused"
    error = act(second["id"], "pause", 400)["error"]
    assert error["code"] == "invalid_state" and "paused" in error["message"]
    assert act(first["id"], "pause")["status"] == "paused"  # its trainer stopped first
    assert act(second["id"], "resume")["status"] == "running"  # the free slot is its
    assert act(first["id"], "resume")["status"] == "queued"
    assert act(first["id"], "cancel")["status"] == "cancelled"
    error = act(first["id"], "cancel", 400)["error"]
    assert error["code"] == "invalid_state"
    assert error["message"].endswith("has already finished (cancelled): it cannot be cancelled.")
    assert act(second["id"], "cancel")["status"] == "cancelled"
    assert manager.started == [first["id"], second["id"]]
    with pytest.raises(sqlite3.OperationalError, match="readonly database"):  # the guard
        client.app.state.db.query("UPDATE jobs SET status = 'queued'")
    assert not hasattr(client.app.state.jobs, "move")  # the gateway's view has no writes
    events = client.get(f"/v1/fine_tuning/jobs/{first['id']}/events?limit=10", headers=KEY)
    assert [e["message"] for e in events.json()["data"]][::-1] == [
        f"Validating training file: {training}", "Files validated, moving job to queued state",
        "Job paused", "Job resumed; queued to continue from its latest checkpoint",
        "Job cancelled"]


def test_without_the_manager_a_job_is_a_503_and_nothing_is_stored(unmanaged, tmp_path) -> None:
    client = unmanaged
    records = Records(tmp_path, "tiny-llama", "")  # as a manager that stopped left them
    data = "\n".join(json.dumps(r) for r in gsm8k(10)).encode()
    training = records.files.create("acme", "train.jsonl", "fine-tune", data, examples=10).id
    records.close()
    error = assert_openai_error(client.post("/v1/fine_tuning/jobs", headers=KEY, json={
        "model": "tiny-llama", "training_file": training}), 503)
    assert error["code"] == "service_unavailable"
    assert client.get("/v1/fine_tuning/jobs", headers=KEY).json()["data"] == []


def test_a_command_the_manager_cannot_record_is_a_503_and_changes_nothing(managed) -> None:
    client, manager = managed
    training = upload(client)
    job = {"model": "tiny-llama", "training_file": training}
    running, waiting = (client.post("/v1/fine_tuning/jobs", headers=KEY, json=job).json()
                        for _ in range(2))
    manager.records.db.close()  # every write of the manager's now fails, as on a broken disk
    error = assert_openai_error(client.post(f"/v1/fine_tuning/jobs/{waiting['id']}/pause",
                                            headers=KEY), 503)
    assert error["code"] == "service_unavailable" and waiting["id"] in error["message"]
    assert_openai_error(client.post("/v1/fine_tuning/jobs", headers=KEY, json=job), 503)
    listed = client.get("/v1/fine_tuning/jobs", headers=KEY).json()["data"]
    assert {j["id"]: j["status"] for j in listed} == {running["id"]: "running",
                                                      waiting["id"]: "queued"}

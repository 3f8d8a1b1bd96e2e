"""The versions API in-process: listing with lineage, promote, rollback, split, delete, tenant
isolation, and OpenAI-shaped errors for what cannot be done."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from tests.e2e.adapters import save_adapter
from tests.gateway.conftest import KEY
from tests.gateway.test_validation import assert_openai_error


@pytest.fixture()
def bot(managed, tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("adapters")
    registry = managed[1].registry  # the records' writer
    for seed in (1, 2, 3):
        registry.register("acme", "bot", save_adapter(root / f"a{seed}", "lora", seed),
                          in_service=seed == 1)
    return "acme/bot"


def versions(client, model: str) -> dict:
    response = client.get(f"/v1/adapters/{model}/versions", headers=KEY)
    assert response.status_code == 200, response.text
    return response.json()


def test_versions_list_with_lineage_and_weights(client, bot) -> None:
    listing = versions(client, bot)
    assert listing["serving"] == [{"version": 1, "weight": 100}]
    assert [(v["id"], v["weight"]) for v in listing["data"]] == [
        ("acme/bot@1", 100), ("acme/bot@2", 0), ("acme/bot@3", 0)]
    first = listing["data"][0]
    assert first["source"] == "registered" and first["passed_gates"] is True
    assert first["lineage"]["peft_config"]["peft_type"] == "LORA"
    assert listing["can_roll_back"] is False
    model = client.get(f"/v1/models/{bot}", headers=KEY).json()
    assert model["version"] == 1 and model["in_service"] is True
    pinned = client.get(f"/v1/models/{bot}@2", headers=KEY).json()
    assert pinned["id"] == "acme/bot@2" and pinned["in_service"] is False


def test_promote_split_and_rollback(client, bot) -> None:
    promoted = client.post(f"/v1/adapters/{bot}/promote", json={"version": 2}, headers=KEY)
    assert promoted.status_code == 200 and promoted.json()["serving"] == [
        {"version": 2, "weight": 100}]
    split = client.post(f"/v1/adapters/{bot}/split", headers=KEY, json={"weights": [
        {"version": 2, "weight": 90}, {"version": 3, "weight": 10}]}).json()
    assert split["serving"] == [{"version": 2, "weight": 90}, {"version": 3, "weight": 10}]
    assert [v["weight"] for v in split["data"]] == [0, 90, 10]
    back = client.post(f"/v1/adapters/{bot}/rollback", headers=KEY).json()
    assert back["serving"] == [{"version": 2, "weight": 100}]
    back = client.post(f"/v1/adapters/{bot}/rollback", headers=KEY).json()
    assert back["serving"] == [{"version": 1, "weight": 100}] and not back["can_roll_back"]
    error = assert_openai_error(client.post(f"/v1/adapters/{bot}/rollback", headers=KEY), 409)
    assert "nothing to roll back to: no earlier" in error["message"] and error["param"] is None
    latest = client.post(f"/v1/adapters/{bot}/promote", headers=KEY).json()  # no body
    assert latest["serving"] == [{"version": 3, "weight": 100}]


def test_what_cannot_be_done_is_a_clear_error(client, bot) -> None:
    error = assert_openai_error(client.post(f"/v1/adapters/{bot}/promote", json={"version": 9},
                                            headers=KEY), 404)
    assert "no version 9" in error["message"]
    error = assert_openai_error(client.post(f"/v1/adapters/{bot}/split", headers=KEY, json={
        "weights": [{"version": 1, "weight": 1}, {"version": 1, "weight": 2}]}), 400)
    assert error["param"] == "weights"
    error = assert_openai_error(client.delete(f"/v1/adapters/{bot}/versions/0", headers=KEY), 400)
    assert error["param"] == "number"
    assert_openai_error(client.get(f"/v1/models/{bot}@01", headers=KEY), 404)  # it is @1
    assert_openai_error(client.post(f"/v1/adapters/{bot}/split", headers=KEY, json={
        "weights": [{"version": 1, "weight": 0}]}), 400)
    error = assert_openai_error(client.delete(f"/v1/adapters/{bot}/versions/1", headers=KEY),
                                409)
    assert "in service" in error["message"]
    assert client.delete(f"/v1/adapters/{bot}/versions/2", headers=KEY).json() == {
        "id": "acme/bot@2", "object": "adapter.version", "deleted": True}
    assert [v["version"] for v in versions(client, bot)["data"]] == [1, 3]
    assert_openai_error(client.delete(f"/v1/adapters/{bot}/versions/2", headers=KEY), 404)


def test_another_tenants_model_is_not_found(client, bot) -> None:
    beta = {"Authorization": "Bearer sk-beta"}
    for response in (client.get(f"/v1/adapters/{bot}/versions", headers=beta),
                     client.post(f"/v1/adapters/{bot}/promote", json={}, headers=beta),
                     client.post(f"/v1/adapters/{bot}/rollback", headers=beta),
                     client.delete(f"/v1/adapters/{bot}/versions/2", headers=beta),
                     client.get(f"/v1/models/{bot}@1", headers=beta)):
        assert assert_openai_error(response, 404)["code"] == "model_not_found"
    assert versions(client, bot)["serving"] == [{"version": 1, "weight": 100}]


def test_a_candidate_version_is_not_served_until_promoted(managed, bot) -> None:
    client, manager = managed
    registry = manager.registry
    source = registry.versions.get(bot, 1).path
    registry.register("acme", "bot", Path(source), origin="fine-tune", in_service=False)
    with registry.db.transaction() as conn:  # as a job's result that failed its gates
        conn.execute("UPDATE versions SET passed_gates = 0 WHERE model = ? AND number = 4",
                     (bot,))
    body = {"model": f"{bot}@4", "prompt": "Hi", "max_tokens": 1}
    error = assert_openai_error(client.post("/v1/completions", json=body, headers=KEY), 409)
    assert error["code"] == "model_not_in_service" and "promote" in error["message"]


def test_the_gateway_writes_no_record_and_the_manager_makes_each_change(managed, tmp_path) -> None:
    """The gateway's connection refuses every write; uploads, promote, split, rollback and
    deletes all work, each made by the manager's desk."""
    client, manager = managed
    with pytest.raises(sqlite3.OperationalError, match="readonly"), \
            client.app.state.db.transaction() as conn:
        conn.execute("DELETE FROM models")
    assert not hasattr(client.app.state.registry, "register")
    assert not hasattr(client.app.state.files, "create")
    for seed in (1, 2):
        adapter = save_adapter(tmp_path / f"a{seed}", "lora", seed)
        files = {key: (name, (adapter / name).read_bytes()) for key, name in
                 (("adapter_config", "adapter_config.json"),
                  ("adapter_model", "adapter_model.safetensors"))}
        response = client.post("/v1/adapters", headers=KEY, files=files,
                               data={"name": "bot", "promote": "false"})
        assert response.status_code == 201, response.text
    assert [v.number for v in manager.registry.versions.list("acme/bot")] == [1, 2]
    assert versions(client, "acme/bot")["serving"] == []  # candidates, until promoted
    assert client.post("/v1/adapters/acme/bot/promote", headers=KEY).status_code == 200
    split = client.post("/v1/adapters/acme/bot/split", headers=KEY, json={"weights": [
        {"version": 1, "weight": 1}, {"version": 2, "weight": 3}]})
    assert split.json()["serving"] == [{"version": 1, "weight": 1}, {"version": 2, "weight": 3}]
    rolled = client.post("/v1/adapters/acme/bot/rollback", headers=KEY).json()
    assert rolled["serving"] == [{"version": 2, "weight": 100}]
    assert client.delete("/v1/adapters/acme/bot/versions/1", headers=KEY).json() == {
        "id": "acme/bot@1", "object": "adapter.version", "deleted": True}
    upload = client.post("/v1/files", headers=KEY, data={"purpose": "fine-tune"}, files={
        "file": ("t.jsonl", b'{"prompt": "a", "completion": "b"}\n')})
    assert upload.status_code == 200, upload.text
    file_id = upload.json()["id"]
    assert manager.records.files.get(file_id, "acme").examples == 1
    assert client.delete(f"/v1/files/{file_id}", headers=KEY).json()["deleted"] is True
    assert client.delete("/v1/models/acme/bot", headers=KEY).json()["deleted"] is True
    assert manager.registry.list("acme") == []
    assert manager.records.files.get(file_id, "acme") is None

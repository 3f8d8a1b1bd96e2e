"""A tenant's storage quota through the gateway, the manager's records behind it: an upload
past it is an OpenAI-shaped 403 and nothing is kept; a response past it is answered but not
stored (`store: false`); deleting makes room; another tenant's quota is its own."""

from __future__ import annotations

import pytest

from gateway.settings import GatewaySettings
from gateway.stored import keep
from gateway.tenants import Tenant
from tests.gateway.conftest import KEY, serving
from tests.gateway.test_files import ROW, upload
from tests.gateway.test_stored import ID, made
from tests.gateway.test_validation import assert_openai_error

QUOTA_MB = 2.5 * len(ROW) / 2**20  # two files fit, not three


@pytest.fixture()
def quota(tmp_path):
    settings = GatewaySettings(data_dir=tmp_path, api_keys="acme=sk-acme,beta=sk-beta",
                               manager=f"ipc://{tmp_path}/manager.sock",
                               max_storage_mb=QUOTA_MB)
    with serving(settings) as served:
        yield served


def test_an_upload_past_the_quota_is_a_403_and_a_delete_makes_room(quota) -> None:
    client, _ = quota
    first, second = (upload(client).json() for _ in range(2))
    refused = assert_openai_error(upload(client), 403)
    assert refused["code"] == "storage_quota_exceeded" and "tenant acme" in refused["message"]
    listed = client.get("/v1/files", headers=KEY).json()["data"]
    assert sorted(f["id"] for f in listed) == sorted([first["id"], second["id"]])
    beta = client.post("/v1/files", headers={"Authorization": "Bearer sk-beta"},
                       data={"purpose": "fine-tune"},
                       files={"file": ("t.jsonl", ROW, "application/jsonl")})
    assert beta.status_code == 200, beta.text
    usage = client.get("/dashboard/api/usage", headers=KEY).json()["storage"]
    assert usage == {"used_bytes": 2 * len(ROW), "quota_bytes": int(QUOTA_MB * 2**20)}
    assert client.delete(f"/v1/files/{first['id']}", headers=KEY).json()["deleted"]
    assert upload(client).status_code == 200


def test_a_response_past_the_quota_is_answered_but_not_stored(quota) -> None:
    client, _ = quota
    tenant = Tenant("acme", max_storage_mb=QUOTA_MB)
    for _ in range(2):
        assert upload(client).status_code == 200
    large = {**made(), "output": [{"type": "message", "text": "x" * len(ROW)}]}
    assert client.portal.call(keep, client.app.state.manager, tenant, large, [], []) is False
    assert client.app.state.responses.get(ID, "acme") is None
    assert client.portal.call(keep, client.app.state.manager, Tenant("acme"), large, [], [])

"""/v1/files through the gateway with the manager's records behind it: `expires_after` as
OpenAI's Files API takes it, form fields it does not know refused, and a burst of uploads listed
by the official SDK in the order they were made."""

from __future__ import annotations

import json

import openai
import pytest

from tests.gateway.conftest import KEY
from tests.gateway.test_validation import assert_openai_error
from workers.manager.file_store import FileStore

ROW = json.dumps({"messages": [{"role": "user", "content": "Hi"},
                               {"role": "assistant", "content": "Hello"}]}).encode()


def upload(client, **form: str):
    return client.post("/v1/files", headers=KEY, data={"purpose": "fine-tune", **form},
                       files={"file": ("t.jsonl", ROW, "application/jsonl")})


def test_a_file_uploaded_with_expires_after_says_when_and_is_gone_after(managed) -> None:
    client, manager = managed
    made = upload(client, **{"expires_after[anchor]": "created_at",
                             "expires_after[seconds]": "3600"})
    assert made.status_code == 200, made.text
    file = made.json()
    assert file["expires_at"] == file["created_at"] + 3600
    assert client.get(f"/v1/files/{file['id']}", headers=KEY).json() == file
    assert "expires_at" not in upload(client).json()  # (OpenAI's schema: absent, never null)
    files: FileStore = manager.records.files
    gone = files.create("acme", "old.jsonl", "fine-tune", ROW, expires_in=-1)
    assert_openai_error(client.get(f"/v1/files/{gone.id}", headers=KEY), 404)
    assert_openai_error(client.get(f"/v1/files/{gone.id}/content", headers=KEY), 404)
    assert gone.id not in [f["id"] for f in client.get("/v1/files", headers=KEY).json()["data"]]
    job = client.post("/v1/fine_tuning/jobs", headers=KEY, json={"model": "tiny-llama",
                                                                  "training_file": gone.id})
    assert assert_openai_error(job, 404)["param"] == "training_file"


@pytest.mark.parametrize(("form", "param"), [
    ({"expires_after[anchor]": "created_at", "expires_after[seconds]": "60"},
     "expires_after[seconds]"),
    ({"expires_after[anchor]": "created_at", "expires_after[seconds]": "2592001"},
     "expires_after[seconds]"),
    ({"expires_after[anchor]": "last_active_at", "expires_after[seconds]": "3600"},
     "expires_after[anchor]"),
    ({"expiry": "3600"}, "expiry"),
])
def test_a_bad_or_unknown_form_field_is_refused_naming_it(client, form: dict, param: str) -> None:
    assert assert_openai_error(upload(client, **form), 400)["param"] == param
    assert client.get("/v1/files", headers=KEY).json()["data"] == []


def test_the_sdk_pages_through_a_burst_of_uploads_newest_first(managed) -> None:
    """Uploads within one second list in the order they were made, however their random ids
    sort: the SDK's pages (`after` = the last id of the page before) neither skip nor repeat."""
    client, _ = managed
    api = openai.OpenAI(api_key="sk-acme", base_url=f"{client.base_url}/v1", http_client=client,
                        max_retries=0)
    made = [api.files.create(file=(f"f{i}.jsonl", ROW), purpose="fine-tune").id
            for i in range(5)]
    assert [f.id for f in api.files.list(limit=2)] == made[::-1]
    assert [f.id for f in api.files.list(limit=2, order="asc")] == made
    first = api.files.list(limit=2)
    assert ([f.id for f in first.data], first.has_more) == (made[:2:-1], True)

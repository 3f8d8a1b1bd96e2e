"""/v1/uploads (a file sent in parts, OpenAI's Uploads API) through the gateway with the
manager's records behind it, driven by the official `openai` SDK: the file it becomes holds the
parts in the order named, as `/v1/files` would have kept it; every mistake is an OpenAI-shaped
error that leaves the upload as it was; parts count in the tenant's storage until they go."""

from __future__ import annotations

import hashlib
import json
import time

import openai
import pytest

from gateway.settings import GatewaySettings
from state.usage import stored_by_kind
from tests.gateway.conftest import KEY, serving
from tests.gateway.test_validation import assert_openai_error

LINES = [json.dumps({"messages": [{"role": "user", "content": f"Question {i}?"},
                                  {"role": "assistant", "content": f"Answer {i}."}]}) + "\n"
         for i in range(6)]
DATA = "".join(LINES).encode()
QUOTA_MB = (3 * len(DATA) + 200) / 2**20  # three copies and a few uploads' records


@pytest.fixture()
def served(tmp_path):
    settings = GatewaySettings(data_dir=tmp_path, api_keys="acme=sk-acme,beta=sk-beta",
                               manager=f"ipc://{tmp_path}/manager.sock",
                               max_body_bytes=64 * 1024, max_upload_bytes=2 * len(DATA),
                               max_storage_mb=QUOTA_MB)
    with serving(settings) as (client, manager):
        yield client, manager, sdk(client, "sk-acme")


def kept(manager, *uploads: tuple[object, str]) -> int:
    """The tenant's files' bytes beside what its uploads' records keep (id, name, MIME type)."""
    rows = sum(len(upload.id) + len(upload.filename) + len(mime) for upload, mime in uploads)
    return stored_by_kind(manager.records.db, "acme")["files"] - rows


def sdk(client, key: str) -> openai.OpenAI:
    return openai.OpenAI(api_key=key, base_url=f"{client.base_url}/v1", http_client=client,
                         max_retries=0)


def test_a_file_sent_in_parts_is_the_file_whole(served) -> None:
    client, manager, api = served
    upload = api.uploads.upload_file_chunked(
        file=DATA, bytes=len(DATA), filename="train.jsonl", mime_type="application/jsonl",
        purpose="fine-tune",
        part_size=100, md5=hashlib.md5(DATA).hexdigest())  # several parts
    assert (upload.status, upload.bytes, upload.filename) == ("completed", len(DATA),
                                                              "train.jsonl")
    assert upload.expires_at == upload.created_at + 3600
    file = upload.file
    assert (file.bytes, file.filename, file.purpose) == (len(DATA), "train.jsonl", "fine-tune")
    assert api.files.retrieve(file.id) == file
    assert api.files.content(file.id).content == DATA
    assert client.get(f"/v1/files/{file.id}", headers=KEY).json()["bytes"] == len(DATA)
    job = client.post("/v1/fine_tuning/jobs", headers=KEY,
                      json={"model": "tiny-llama", "training_file": file.id})
    assert job.status_code == 200, job.text  # validated and counted as an upload's file is
    assert kept(manager, (upload, "application/jsonl")) == len(DATA)  # its parts gone
    assert list(manager.records.uploads.parts_dir.iterdir()) == []


def test_the_parts_join_in_the_order_named_and_the_file_expires_as_asked(served) -> None:
    _, _, api = served
    upload = api.uploads.create(bytes=len(DATA), filename="t.jsonl", mime_type="text/jsonl",
                                purpose="fine-tune",
                                expires_after={"anchor": "created_at", "seconds": 7200})
    assert upload.status == "pending" and upload.file is None
    halves = DATA[:len(LINES[0]) * 2], DATA[len(LINES[0]) * 2:]
    first, second = (api.uploads.parts.create(upload.id, data=half) for half in halves)
    assert (first.object, first.upload_id) == ("upload.part", upload.id)
    done = api.uploads.complete(upload.id, part_ids=[second.id, first.id])
    assert api.files.content(done.file.id).content == halves[1] + halves[0]
    assert done.file.expires_at == done.file.created_at + 7200


def test_mistakes_are_openai_errors_and_leave_the_upload_pending(served) -> None:
    client, manager, api = served
    upload = api.uploads.create(bytes=len(DATA), filename="t.jsonl",
                                mime_type="application/jsonl", purpose="fine-tune")
    path = f"/v1/uploads/{upload.id}"
    part = api.uploads.parts.create(upload.id, data=DATA[:50])
    assert kept(manager, (upload, "application/jsonl")) == 50  # a part counts
    too_many = client.post(f"{path}/parts", headers=KEY, files={"data": ("p", DATA)})
    assert assert_openai_error(too_many, 409)["code"] == "upload_too_large"
    rest = api.uploads.parts.create(upload.id, data=DATA[50:])
    for part_ids, status, wrong in (([part.id], 409, "hold 50 bytes"),
                                    ([part.id, "part-x"], 409, "part-x"),
                                    ([part.id, part.id, rest.id], 400, "more than once")):
        refused = client.post(f"{path}/complete", headers=KEY, json={"part_ids": part_ids})
        error = assert_openai_error(refused, status)
        assert error["param"] == "part_ids" and wrong in error["message"], error
    refused = client.post(f"{path}/complete", headers=KEY,
                          json={"part_ids": [part.id, rest.id], "md5": "0" * 32})
    assert assert_openai_error(refused, 400)["param"] == "md5"
    with pytest.raises(openai.BadRequestError) as exc:  # invalid JSONL: lines in this order
        api.uploads.complete(upload.id, part_ids=[rest.id, part.id])
    assert exc.value.code == "invalid_file_format" and exc.value.param is None
    assert "line 1" in exc.value.message.lower(), exc.value.message
    assert client.get("/v1/files", headers=KEY).json()["data"] == []
    beta = sdk(client, "sk-beta")
    with pytest.raises(openai.NotFoundError):  # another tenant's
        beta.uploads.complete(upload.id, part_ids=[part.id, rest.id])
    assert api.uploads.complete(upload.id, part_ids=[part.id, rest.id]).status == "completed"
    again = client.post(f"{path}/parts", headers=KEY, files={"data": ("p", b"{}")})
    assert assert_openai_error(again, 409)["code"] == "upload_not_pending"


@pytest.mark.parametrize(("body", "status", "param"), [
    ({"bytes": 2 * len(DATA) + 1}, 400, "bytes"), ({"bytes": 0}, 400, "bytes"),
    ({"mime_type": "image/png"}, 400, "mime_type"), ({"purpose": "vision"}, 400, "purpose"),
    ({"expires_after": {"anchor": "created_at", "seconds": 60}}, 400,
     "expires_after.seconds"), ({"parts": 2}, 400, "parts")])
def test_a_bad_upload_is_refused_naming_its_field(served, body: dict, status: int,
                                                  param: str) -> None:
    client, manager, _ = served
    asked = {"bytes": 10, "filename": "t.jsonl", "mime_type": "application/jsonl",
             "purpose": "fine-tune", **body}
    error = assert_openai_error(client.post("/v1/uploads", headers=KEY, json=asked), status)
    assert error["param"] == param
    schema = client.get("/openapi.json").json()["components"]["schemas"]["UploadRequest"]
    assert schema["properties"]["bytes"]["maximum"] == 2 * len(DATA)  # the setting, published
    assert manager.records.db.query("SELECT COUNT(*) AS n FROM uploads")[0]["n"] == 0


def test_a_cancelled_or_expired_upload_takes_nothing_and_its_parts_go(served) -> None:
    _, manager, api = served
    uploads = manager.records.uploads
    cancelled = api.uploads.create(bytes=len(DATA), filename="t.jsonl",
                                   mime_type="application/jsonl", purpose="fine-tune")
    part = api.uploads.parts.create(cancelled.id, data=DATA)
    assert api.uploads.cancel(cancelled.id).status == "cancelled"
    assert not uploads.path(part.id).exists() and uploads.parts(cancelled.id) == []
    assert kept(manager, (cancelled, "application/jsonl")) == 0
    with pytest.raises(openai.ConflictError) as exc:
        api.uploads.complete(cancelled.id, part_ids=[part.id])
    assert exc.value.code == "upload_not_pending" and "cancelled" in exc.value.message
    late = api.uploads.create(bytes=len(DATA), filename="t.jsonl",
                              mime_type="application/jsonl", purpose="fine-tune")
    part = api.uploads.parts.create(late.id, data=DATA)
    with manager.records.db.transaction() as conn:
        conn.execute("UPDATE uploads SET expires_at = ? WHERE id = ?",
                     (int(time.time()) - 1, late.id))
    with pytest.raises(openai.ConflictError) as exc:
        api.uploads.complete(late.id, part_ids=[part.id])
    assert "expired" in exc.value.message
    assert uploads.expire(int(time.time())) == [late.id]
    assert not uploads.path(part.id).exists()
    assert kept(manager, (cancelled, "application/jsonl"), (late, "application/jsonl")) == 0
    assert uploads.expire(int(time.time()) + 2 * 3600) == []  # their records forgotten an hour
    # after their own hour, and what they kept with them
    assert uploads.get(late.id, "acme") is None and uploads.get(cancelled.id, "acme") is None
    assert stored_by_kind(manager.records.db, "acme")["files"] == 0


def test_parts_past_the_storage_quota_are_a_403(served) -> None:
    client, _, api = served
    first, second = (api.uploads.create(bytes=2 * len(DATA), filename="t.jsonl",
                                        mime_type="application/jsonl", purpose="fine-tune")
                     for _ in range(2))
    for upload in (first, first, second):
        api.uploads.parts.create(upload.id, data=DATA)
    refused = client.post(f"/v1/uploads/{second.id}/parts", headers=KEY,
                          files={"data": ("p", DATA)})
    assert assert_openai_error(refused, 403)["code"] == "storage_quota_exceeded"
    asked = {"bytes": 10, "filename": "t.jsonl", "mime_type": "application/jsonl",
             "purpose": "fine-tune"}
    answers = [client.post("/v1/uploads", headers=KEY, json=asked) for _ in range(3)]
    assert [a.status_code for a in answers] == [200, 403, 403]  # ~55 bytes a record, 90 left


def test_a_part_gone_while_completing_is_a_409_not_a_500(served) -> None:
    """(As when the upload is cancelled between the check and the join: here its bytes alone.)"""
    client, manager, api = served
    upload = api.uploads.create(bytes=len(DATA), filename="t.jsonl",
                                mime_type="application/jsonl", purpose="fine-tune")
    part = api.uploads.parts.create(upload.id, data=DATA)
    manager.records.uploads.path(part.id).unlink()
    refused = client.post(f"/v1/uploads/{upload.id}/complete", headers=KEY,
                          json={"part_ids": [part.id]})
    assert "is gone" in assert_openai_error(refused, 409)["message"]
    assert client.get("/v1/files", headers=KEY).json()["data"] == []


def test_the_manager_deletes_part_files_no_record_names_as_it_starts(served) -> None:
    """(Left by a manager stopped between an upload's end, recorded with its file, and the
    removal of its parts' bytes.)"""
    _, manager, api = served
    uploads = manager.records.uploads
    upload = api.uploads.create(bytes=len(DATA), filename="t.jsonl",
                                mime_type="application/jsonl", purpose="fine-tune")
    live = api.uploads.parts.create(upload.id, data=DATA)
    (uploads.parts_dir / "part-0123456789abcdef01234567").write_bytes(b"left")
    assert uploads.sweep() == 1
    assert [path.name for path in uploads.parts_dir.iterdir()] == [live.id]
    assert api.uploads.complete(upload.id, part_ids=[live.id]).status == "completed"


def test_a_file_of_the_largest_size_goes_whole_or_in_the_sdks_default_part(served) -> None:
    """The body guard's limit on a form leaves room for its framing beside the largest file."""
    client, _, api = served
    largest = DATA * 2  # the served limit, exactly
    upload = api.uploads.upload_file_chunked(file=largest, bytes=len(largest),
                                             filename="t.jsonl", mime_type="application/jsonl",
                                             purpose="fine-tune")
    assert api.files.content(upload.file.id).content == largest
    api.files.delete(upload.file.id)  # room in the quota
    whole = client.post("/v1/files", headers=KEY, data={"purpose": "fine-tune"},
                        files={"file": ("t.jsonl", largest, "application/jsonl")})
    assert whole.status_code == 200, whole.text
    over = client.post("/v1/files", headers=KEY, data={"purpose": "fine-tune"},
                       files={"file": ("t.jsonl", largest + b"\n", "application/jsonl")})
    assert assert_openai_error(over, 413)["code"] == "file_too_large"

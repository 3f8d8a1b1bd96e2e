"""A tenant's storage quota at the manager's desk, with its real stores on a data dir: a file,
an adapter or a stored response that would take the tenant past its quota is a 403 and nothing
is kept; what is kept counts (files, stored responses, adapter directories, a running batch's
answers), another tenant's does not, deleting frees room, and no quota (0) refuses nothing."""

from __future__ import annotations

import json
import time

from state.usage import stored_bytes
from tests.e2e.adapters import save_adapter
from tests.workers.manager.test_store_desk import act, records, response_record, staged_adapter
from wire.store import StoreAction

__all__ = ["records"]  # the fixture
ROW = b'{"prompt": "a", "completion": "b"}\n' * 100  # 3,500 bytes


def add_file(records, tenant: str = "acme", quota: int = 0):
    staged = records.files.staging()
    staged.write_bytes(ROW)
    return act(records, StoreAction.ADD_FILE, tenant, name="t.jsonl", staged=staged.name,
               purpose="fine-tune", examples=100, format="prompt-completion",
               quota_bytes=quota)


def test_a_file_past_the_quota_is_refused_and_a_delete_makes_room(records) -> None:
    first = add_file(records, quota=8_000)
    assert first.ok
    assert add_file(records, quota=8_000).ok  # 7,000 of 8,000
    refused = add_file(records, quota=8_000)
    assert (refused.status, refused.code) == (403, "storage_quota_exceeded")
    assert "acme" in refused.message and "(3.4 KB)" in refused.message and \
        "6.8 KB of 7.8 KB in use" in refused.message
    assert len(records.files.list("acme", purpose=None, after=None, limit=10,
                                  order="asc")[0]) == 2
    assert stored_bytes(records.db, "acme") == 2 * len(ROW)
    assert add_file(records, "beta", quota=4_000).ok  # acme's files are not beta's
    assert add_file(records).ok  # no quota
    assert act(records, StoreAction.DELETE_FILE, file_id=first.made).ok
    assert stored_bytes(records.db, "acme") == 2 * len(ROW)
    assert not add_file(records, quota=8_000).ok  # 7,000 in use again
    assert add_file(records, quota=11_000).ok


def test_stored_responses_and_adapters_count_and_are_refused_past_it(records,
                                                                     tmp_path) -> None:
    record = response_record(f"resp_{'a' * 32}", int(time.time()))
    assert act(records, StoreAction.ADD_RESPONSE, record=record).ok
    used = stored_bytes(records.db, "acme")
    stored = records.responses.get(f"resp_{'a' * 32}", "acme")
    assert 0 < used < len(record.encode()) and stored is not None
    second = response_record(f"resp_{'b' * 32}", int(time.time()))
    refused = act(records, StoreAction.ADD_RESPONSE, record=second, quota_bytes=used + 10)
    assert (refused.status, refused.code) == (403, "storage_quota_exceeded")
    assert records.responses.get(f"resp_{'b' * 32}", "acme") is None
    source = save_adapter(tmp_path / "a", "lora", 1)
    size = sum((source / name).stat().st_size  # the files an upload stages
               for name in ("adapter_config.json", "adapter_model.safetensors"))
    refused = act(records, StoreAction.ADD_ADAPTER, name="bot", quota_bytes=used + size - 1,
                  staged=staged_adapter(records, source))
    assert (refused.status, refused.code) == (403, "storage_quota_exceeded")
    assert records.registry.list("acme") == []
    made = act(records, StoreAction.ADD_ADAPTER, name="bot", quota_bytes=used + size + 1,
               staged=staged_adapter(records, source))
    assert made.ok and stored_bytes(records.db, "acme") == used + size
    assert stored_bytes(records.db, "beta") == 0
    source = records.files.create("acme", "in.jsonl", "batch", b'{"custom_id": "a"}\n')
    batch_id = f"batch_{'c' * 32}"
    assert act(records, StoreAction.ADD_BATCH, record=json.dumps(
        {"id": batch_id, "endpoint": "/v1/completions", "input_file_id": source.id,
         "total": 1})).ok
    before = stored_bytes(records.db, "acme")
    assert act(records, StoreAction.BATCH_RESULT, record=json.dumps(
        {"batch_id": batch_id, "line": 0, "custom_id": "a",
         "response": {"status_code": 200, "request_id": "r", "body": {"x": "y" * 1000}}})).made
    assert stored_bytes(records.db, "acme") > before + 1000  # a running batch's

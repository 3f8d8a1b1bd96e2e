"""Batches at the manager's desk, with its real stores on a data dir: a batch runs only for its
tenant's own input file; each line's result is kept once and counted; a cancel marks it; the
finish gathers the results into an output and an error file in the input's order, the lines
never run named as such; the input file cannot be deleted while the batch runs."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from tests.workers.manager.test_store_desk import act, records
from wire.store import StoreAction
from workers.manager import batch_store

__all__ = ["records"]  # the fixture
URL = "/v1/chat/completions"


def batch_file(records, tenant: str = "acme", n: int = 3, purpose: str = "batch"):
    rows = [json.dumps({"custom_id": f"c{k}", "method": "POST", "url": URL,
                        "body": {"model": "m"}}) for k in range(n)]
    return records.files.create(tenant, "in.jsonl", purpose, "\n".join(rows).encode())


def add(records, file_id: str, tenant: str = "acme", total: int = 3, **fields):
    batch_id = f"batch_{uuid.uuid4().hex}"
    answer = act(records, StoreAction.ADD_BATCH, tenant, record=json.dumps(
        {"id": batch_id, "endpoint": URL, "input_file_id": file_id, "total": total,
         "metadata": None, **fields}))
    return batch_id, answer


def keep(records, batch_id: str, line: int, status: int, tenant: str = "acme", **body):
    return act(records, StoreAction.BATCH_RESULT, tenant, record=json.dumps(
        {"batch_id": batch_id, "line": line, "custom_id": f"c{line}",
         "response": {"status_code": status, "request_id": "r",
                      "body": {"line": line, **body}}}))


@pytest.mark.parametrize("page", [500, 1])  # read whole, or an answer at a time
def test_a_batch_keeps_each_result_once_and_finishes_into_two_files(records, page,
                                                                     monkeypatch) -> None:
    monkeypatch.setattr(batch_store, "PAGE", page)
    source = batch_file(records, n=4)
    batch_id, answer = add(records, source.id, total=4)
    assert answer.ok and answer.made == batch_id
    assert records.batches.get(batch_id, "acme").status == "in_progress"
    assert [b.id for b in records.batches.active()] == [batch_id]
    chat = {"usage": {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}}
    assert keep(records, batch_id, 2, 200, **chat).made == "kept"
    assert keep(records, batch_id, 2, 200, **chat).made == ""  # run again after a restart: once
    assert keep(records, batch_id, 0, 400).made == "kept"
    assert keep(records, batch_id, 0, 400, tenant="beta").made == ""  # not beta's
    assert keep(records, batch_id, 4, 200).made == ""  # no such line
    assert records.batches.done_lines(batch_id) == {0, 2}
    assert records.batches.get(batch_id, "acme").body["request_counts"] == \
        {"total": 4, "completed": 1, "failed": 1}
    assert keep(records, batch_id, 1, 200, usage={"input_tokens": 7, "output_tokens": 2}).made
    assert records.batches.get(batch_id, "acme").body["usage"] == {
        "input_tokens": 12, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": 5,
        "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 17}
    refused = act(records, StoreAction.DELETE_FILE, file_id=source.id)
    assert (refused.status, refused.code) == (409, "file_in_use") and batch_id in refused.message
    assert act(records, StoreAction.CANCEL_BATCH, batch_id=batch_id).ok
    assert records.batches.get(batch_id, "acme").status == "cancelling"
    assert act(records, StoreAction.FINISH_BATCH, batch_id=batch_id, name="cancelled").ok
    done = records.batches.get(batch_id, "acme").body
    assert done["status"] == "cancelled" and done["cancelled_at"] >= done["cancelling_at"]
    assert done["request_counts"] == {"total": 4, "completed": 2, "failed": 1}

    def lines(file_id: str) -> list[dict]:
        text = Path(records.files.get(file_id, "acme").path).read_text()
        return [json.loads(line) for line in text.splitlines()]

    output, errors = lines(done["output_file_id"]), lines(done["error_file_id"])
    assert [(o["custom_id"], o["response"]["body"]["line"]) for o in output] == \
        [("c1", 1), ("c2", 2)]  # the input's order
    assert [(e["custom_id"], e["response"] and e["response"]["status_code"], e["error"])
            for e in errors] == [
        ("c0", 400, None),
        ("c3", None, {"code": "batch_cancelled",
                      "message": "This request was not run: the batch was cancelled."})]
    assert all(o["id"].startswith("batch_req_") for o in output + errors)
    assert records.files.get(done["output_file_id"], "acme").purpose == "batch_output"
    assert records.batches.active() == [] and records.batches.done_lines(batch_id) == set()
    assert keep(records, batch_id, 3, 200).made == ""  # finished: nothing more
    assert act(records, StoreAction.DELETE_FILE, file_id=source.id).ok


def test_a_batch_runs_only_for_the_tenants_own_batch_file(records) -> None:
    theirs, tuning = batch_file(records, "beta"), batch_file(records, purpose="fine-tune")
    for file_id in (theirs.id, tuning.id, "file-none"):
        assert add(records, file_id)[1].code == "invalid_record"
    source = batch_file(records)
    for fields in ({"id": "batch_../x"}, {"endpoint": "/v1/moderations"}, {"total": 0}):
        assert add(records, source.id, **fields)[1].code == "invalid_record"
    assert records.batches.list("acme", after=None, limit=10) == ([], False)
    batch_id, _ = add(records, source.id)
    assert act(records, StoreAction.CANCEL_BATCH, "beta", batch_id=batch_id).status == 404
    assert act(records, StoreAction.FINISH_BATCH, "beta", batch_id=batch_id,
               name="completed").status == 404
    assert act(records, StoreAction.FINISH_BATCH, batch_id=batch_id, name="completed").ok
    done = records.batches.get(batch_id, "acme").body
    assert done["status"] == "completed" and done["output_file_id"] is None
    errors = Path(records.files.get(done["error_file_id"], "acme").path).read_text()
    assert [json.loads(e)["error"]["code"] for e in errors.splitlines()] == \
        ["request_not_run"] * 3  # finished before any ran: as if its file had gone

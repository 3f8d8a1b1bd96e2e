"""The manager's desk for record changes, with its real stores on a data dir: each command acts
on the commanding tenant's own records only, takes staged uploads by name only, refuses what a
job still reads, and changes nothing when it refuses; the data dir has one writer at a time."""

from __future__ import annotations

import hashlib
import json
import select
import shutil
import sqlite3
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.job_spec import JobSpec, PeftSpec
from state.db import Database
from state.jobs import new_id
from tests.e2e.adapters import save_adapter
from wire.jobs import NewJob
from wire.store import StoreAction, StoreAnswer, StoreCommand
from workers.manager.inspector import Inspector
from workers.manager.records import Busy, Records, writing
from workers.manager.specs import trainer_job

MODEL = "tiny-llama"


@pytest.fixture()
def records(tmp_path) -> Iterator[Records]:
    held = Records(tmp_path / "data", MODEL, "tcp://*:5999")
    yield held
    held.close()


def act(records: Records, action: StoreAction, tenant: str = "acme", **fields) -> StoreAnswer:
    return records.desk.command(StoreCommand(id=uuid.uuid4().hex, action=action, tenant=tenant,
                                             **fields))


def staged_adapter(records: Records, source: Path) -> str:
    staged = records.registry.staging()
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        shutil.copyfile(source / name, staged / name)
    return staged.name


def test_an_adapter_upload_is_added_promoted_split_rolled_back_and_deleted(records,
                                                                          tmp_path) -> None:
    sources = [save_adapter(tmp_path / f"a{seed}", "lora", seed) for seed in (1, 2)]
    first = act(records, StoreAction.ADD_ADAPTER, name="bot",
                staged=staged_adapter(records, sources[0]))
    assert first.ok and first.made == "acme/bot@1"
    held = act(records, StoreAction.ADD_ADAPTER, name="bot", hold=True,
               staged=staged_adapter(records, sources[1]))
    assert held.made == "acme/bot@2" and records.registry.get("acme/bot").serving == "[[1, 100]]"
    assert list((records.registry.data_dir / "staging").iterdir()) == []  # moved, not copied
    assert act(records, StoreAction.PROMOTE, model="acme/bot", number=2).ok
    assert act(records, StoreAction.SPLIT, model="acme/bot", split=[[1, 30], [2, 70]]).ok
    assert records.registry.get("acme/bot").serving == "[[1, 30], [2, 70]]"
    assert act(records, StoreAction.ROLLBACK, model="acme/bot").ok
    assert records.registry.get("acme/bot").serving == "[[2, 100]]"
    refused = act(records, StoreAction.DELETE_VERSION, model="acme/bot", number=2)
    assert (refused.status, refused.code) == (409, "invalid_version")
    deleted = act(records, StoreAction.DELETE_VERSION, model="acme/bot", number=1)
    assert deleted.deleted == ["acme/bot@1"]
    assert act(records, StoreAction.DELETE_MODEL, model="acme/bot").deleted == ["acme/bot@2"]
    assert records.registry.get("acme/bot") is None


def test_another_tenants_model_or_file_is_not_found_and_stays(records, tmp_path) -> None:
    source = save_adapter(tmp_path / "a", "lora", 1)
    act(records, StoreAction.ADD_ADAPTER, name="bot", staged=staged_adapter(records, source))
    file_id = records.files.create("acme", "t.jsonl", "fine-tune", b"{}\n").id
    for action in (StoreAction.PROMOTE, StoreAction.ROLLBACK, StoreAction.DELETE_MODEL,
                   StoreAction.DELETE_VERSION, StoreAction.WITHDRAW):
        answer = act(records, action, tenant="beta", model="acme/bot", number=1)
        assert (answer.status, answer.code) == (404, "model_not_found"), action
    answer = act(records, StoreAction.DELETE_FILE, tenant="beta", file_id=file_id)
    assert (answer.status, answer.code) == (404, "file_not_found")
    assert records.registry.get("acme/bot") is not None
    assert records.files.get(file_id, "acme") is not None


@pytest.mark.parametrize("name", ["../../etc", "/etc/passwd", "upload-x.tmp", "adapter-..",
                                  "staging/adapter-0123456789abcdef01234567", "",
                                  "adapter-0123456789abcdef01234567\n",
                                  "upload-0123456789abcdef01234567.tmp\n"])
def test_a_staged_upload_is_named_never_a_path(records, name) -> None:
    for action, code in ((StoreAction.ADD_FILE, "invalid_file"),
                         (StoreAction.ADD_ADAPTER, "invalid_adapter")):
        answer = act(records, action, name="x", staged=name, purpose="fine-tune")
        assert (answer.status, answer.code) == (400, code)
    assert records.files.list("acme", purpose=None, after=None, limit=10, order="asc")[0] == []
    assert records.registry.list("acme") == []


def test_a_file_of_no_known_purpose_is_400_and_stays_staged(records) -> None:
    staged = records.files.staging()
    staged.write_bytes(b'{"prompt": "a", "completion": "b"}\n')
    answer = act(records, StoreAction.ADD_FILE, name="t.jsonl", staged=staged.name,
                 purpose="../batch")
    assert (answer.status, answer.code) == (400, "invalid_purpose")
    assert records.files.list("acme", purpose=None, after=None, limit=10, order="asc")[0] == []
    made = act(records, StoreAction.ADD_FILE, name="t.jsonl", staged=staged.name,
               purpose="fine-tune", examples=1, format="prompt-completion")
    assert made.ok and records.files.get(made.made, "acme").purpose == "fine-tune"


def test_a_bad_adapter_is_400_and_nothing_is_stored(records, tmp_path) -> None:
    staged = records.registry.staging()
    (staged / "adapter_config.json").write_text('{"peft_type": "LORA"}')
    (staged / "adapter_model.safetensors").write_bytes(b"\x08" + b"\x00" * 7 + b"{garbage")
    answer = act(records, StoreAction.ADD_ADAPTER, name="bot", staged=staged.name)
    assert (answer.status, answer.code) == (400, "invalid_adapter")
    assert records.registry.list("acme") == [] and not (records.registry.root / "acme").exists()


def test_uploads_are_read_off_the_loop_which_answers_others_meanwhile(records,
                                                                      tmp_path) -> None:
    """While an upload is read (held here until released), other commands are answered; once
    read, the loop's pipe is readable and the uploads are recorded in the order they came, a
    bad one refused with nothing stored."""
    release = threading.Event()

    def held(source: Path):
        assert release.wait(30)
        return records.registry.inspect(source)

    records.inspector.close()
    records.inspector = Inspector(held)
    sources = [save_adapter(tmp_path / f"a{seed}", "lora", seed) for seed in (1, 2)]
    bad = records.registry.staging()
    (bad / "adapter_config.json").write_text('{"peft_type": "LORA"}')
    (bad / "adapter_model.safetensors").write_bytes(b"\x08" + b"\x00" * 7 + b"{garbage")
    uploads = [StoreCommand(id=f"u{i}", action=StoreAction.ADD_ADAPTER, tenant="acme",
                            name=name, staged=staged)
               for i, (name, staged) in enumerate((
                   ("bot", staged_adapter(records, sources[0])),
                   ("bot", staged_adapter(records, sources[1])), ("bad", bad.name)))]
    assert [records.take(b"gw", u) for u in uploads] == [None, None, None]
    nowhere = StoreCommand(id="n", action=StoreAction.ADD_ADAPTER, tenant="acme", name="x",
                           staged="../../etc")
    assert records.take(b"gw", nowhere).code == "invalid_adapter"  # at once, no path read
    staged_file = records.files.staging()
    staged_file.write_bytes(b'{"prompt": "a", "completion": "b"}\n')
    added = records.take(b"gw", StoreCommand(id="f", action=StoreAction.ADD_FILE,
                                             tenant="acme", name="t.jsonl", purpose="fine-tune",
                                             staged=staged_file.name, examples=1))
    assert added.ok and list(records.finished()) == []  # answered while the uploads wait
    assert select.select([records.inspector], [], [], 0.2)[0] == []
    release.set()
    answers: list[tuple[bytes, StoreAnswer]] = []
    while len(answers) < 3:
        assert select.select([records.inspector], [], [], 30)[0], "no upload was done"
        answers += records.finished()
    assert [(to, a.id, a.status, a.made) for to, a in answers] == [
        (b"gw", "u0", 200, "acme/bot@1"), (b"gw", "u1", 200, "acme/bot@2"),
        (b"gw", "u2", 400, "")]
    assert answers[2][1].code == "invalid_adapter" and records.registry.get("acme/bad") is None
    lineage = records.registry.versions.get("acme/bot", 2).lineage
    assert json.loads(lineage)["adapter_sha256"] == hashlib.sha256(
        (sources[1] / "adapter_model.safetensors").read_bytes()).hexdigest()


def test_what_an_unfinished_job_reads_is_refused_409(records, tmp_path) -> None:
    source = save_adapter(tmp_path / "a", "lora", 1)
    act(records, StoreAction.ADD_ADAPTER, name="bot", staged=staged_adapter(records, source))
    file_id = records.files.create("acme", "t.jsonl", "fine-tune", b"{}\n").id
    spec = JobSpec(1, 2, 1.0, PeftSpec(init_model="acme/bot@1"))
    job = records.ledger.create(new_id("ftjob"), NewJob(
        tenant="acme", model=MODEL, training_file=file_id, suffix="s", seed=1, spec=spec))
    answer = act(records, StoreAction.DELETE_FILE, file_id=file_id)
    assert (answer.status, answer.code) == (409, "file_in_use") and job.id in answer.message
    answer = act(records, StoreAction.DELETE_MODEL, model="acme/bot")
    assert (answer.status, answer.code) == (409, "model_in_use") and job.id in answer.message
    assert records.files.get(file_id, "acme") is not None
    assert records.registry.get("acme/bot") is not None


def test_one_writer_holds_the_data_dir_and_names_where_it_answers(tmp_path) -> None:
    manager = Records(tmp_path, MODEL, "tcp://*:5999")
    with pytest.raises(Busy) as second:
        Records(tmp_path, MODEL, "ipc:///elsewhere")
    assert str(second.value) == "tcp://127.0.0.1:5999"  # a wildcard bind, made reachable
    with pytest.raises(Busy), writing(tmp_path):
        pass
    manager.close()
    with writing(tmp_path), pytest.raises(Busy):  # no manager: a tool holds it for its change
        Records(tmp_path, MODEL, "ipc:///x")
    Records(tmp_path, MODEL, "ipc:///x").close()  # and lets go


def test_the_gateways_connection_refuses_every_write(tmp_path) -> None:
    reader = Database(tmp_path / "state.db", read_only=True)
    with pytest.raises(sqlite3.OperationalError, match="readonly"), \
            reader.transaction() as conn:
        conn.execute("DELETE FROM files")
    assert reader.query("SELECT COUNT(*) FROM models")[0][0] == 0  # reading works


def test_a_file_past_its_expiry_is_gone_and_deleted_once_no_job_reads_it(records) -> None:
    kept = records.files.create("acme", "k.jsonl", "fine-tune", b"{}\n", expires_in=3600)
    read = records.files.create("acme", "r.jsonl", "fine-tune", b"{}\n", expires_in=-1)
    free = records.files.create("acme", "f.jsonl", "fine-tune", b"{}\n", expires_in=-1)
    job = records.ledger.create(new_id("ftjob"), NewJob(
        tenant="acme", model=MODEL, training_file=read.id, suffix="s", seed=1,
        spec=JobSpec(1, 2, 1.0, PeftSpec())))
    assert kept.expires_at == kept.created_at + 3600 and kept.public()["expires_at"] == \
        kept.expires_at
    assert records.files.get(free.id, "acme") is None
    listed, _ = records.files.list("acme", purpose=None, after=None, limit=10, order="asc")
    assert [r.id for r in listed] == [kept.id]
    assert trainer_job(records.jobs.get(job.id), records.files).training_path == read.path
    assert records.desk.expire_files(int(time.time())) == [free.id]
    assert not Path(free.path).exists() and Path(read.path).exists()
    assert act(records, StoreAction.DELETE_FILE, file_id=read.id).status == 404
    assert records.jobs.move(job.id, "cancelled")
    assert records.desk.expire_files(int(time.time())) == [read.id]
    assert not Path(read.path).exists() and records.files.get(kept.id, "acme") == kept


def test_a_failing_expiry_sweep_is_logged_and_the_manager_goes_on(records, caplog) -> None:
    records.db.conn.close()  # every query fails now
    records.expire()
    assert "deleting expired files, responses, chat completions or uploads failed" in caplog.text


def response_record(response_id: str, created_at: int, own: int = 1) -> str:
    conversation = [{"type": "message", "id": "msg_1", "role": "user", "content": "Hi"},
                    {"type": "message", "id": "msg_2", "role": "user", "content": "Again"}]
    return json.dumps({"id": response_id, "created_at": created_at, "own": own,
                       "body": {"id": response_id, "output": [{"type": "message"}]},
                       "conversation": conversation})


def test_a_stored_response_is_its_tenants_until_deleted_or_past_its_retention(records) -> None:
    from state.responses import RETENTION_S

    now, first, old = int(time.time()), f"resp_{'a' * 32}", f"resp_{'b' * 32}"
    made = act(records, StoreAction.ADD_RESPONSE, record=response_record(first, now))
    assert made.ok and made.made == first
    assert act(records, StoreAction.ADD_RESPONSE,
               record=response_record(old, now - RETENTION_S - 1, own=2)).ok
    stored = records.responses.get(first, "acme")
    assert stored.expires_at == now + RETENTION_S and stored.body["id"] == first
    assert [i["id"] for i in stored.input_items] == ["msg_2"]
    assert [i["type"] for i in stored.continued()] == ["message"] * 3
    assert records.responses.get(first, "other") is None  # another tenant's
    assert records.responses.get(old, "acme") is None  # past its retention: gone
    assert act(records, StoreAction.DELETE_RESPONSE, "other", response_id=first).status == 404
    assert records.responses.expire(now) == 1  # the old one
    assert act(records, StoreAction.DELETE_RESPONSE, response_id=first).deleted == [first]
    assert records.responses.get(first, "acme") is None
    answer = act(records, StoreAction.DELETE_RESPONSE, response_id=first)
    assert (answer.status, answer.message) == (404, f"Response with id '{first}' not found.")


@pytest.mark.parametrize("record", [
    "not json", "[]", json.dumps({"id": "../x", "created_at": 1, "own": 0, "body": {},
                                  "conversation": []}),
    response_record(f"resp_{'c' * 32}", 1, own=3), response_record(f"resp_{'c' * 32}", 1, -1)])
def test_a_malformed_response_record_is_refused_and_nothing_kept(records, record) -> None:
    answer = act(records, StoreAction.ADD_RESPONSE, record=record)
    assert (answer.status, answer.code) == (400, "invalid_record")
    assert records.db.query("SELECT COUNT(*) FROM responses")[0][0] == 0


def test_a_manager_on_a_held_data_dir_stops_leaving_nothing_behind(tmp_path) -> None:
    import os
    import subprocess
    import sys

    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    held = Records(tmp_path / "data", MODEL, "ipc:///held")
    try:
        done = subprocess.run(
            [sys.executable, "-m", "workers.manager", "--data-dir", str(tmp_path / "data"),
             "--bind", f"ipc://{run}/manager.sock"], env={**os.environ, "XDG_RUNTIME_DIR":
                                                          str(run)},
            capture_output=True, text=True, timeout=120)
    finally:
        held.close()
    assert done.returncode == 1 and "ipc:///held holds the data dir" in done.stderr, done.stderr
    assert not list(run.rglob("workers-*"))  # no socket directory of its own left behind

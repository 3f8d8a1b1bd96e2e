"""What each tenant's records keep, summed by SQLite's triggers (`state.kept_bytes`), against
every record read back and measured, after each change the manager's real stores make:
responses added, linked, settled, handed on, deleted and expired; chat completions kept,
tagged anew, deleted; conversations made, extended, an item deleted, deleted whole; a batch's
answers kept and, as it finishes, given up; files and adapter versions added and deleted,
against the files on disk; records kept before the sums are summed by their migration, and
versions recorded before their sizes by the registry as it starts."""

from __future__ import annotations

import json
import time
from pathlib import Path

from state.adapters import FILES
from state.db import Database, db_path
from state.kept_bytes import COUNTED
from state.kept_bytes import MIGRATION as KEPT_BYTES
from state.migrations import MIGRATIONS
from state.usage import KINDS, directory_bytes, stored_by_kind
from tests.e2e.adapters import save_adapter
from tests.workers.manager import test_batch_store as batches
from tests.workers.manager import test_chat_store as chats
from tests.workers.manager import test_conversation_store as conversations
from tests.workers.manager.test_quota import add_file
from tests.workers.manager.test_response_chain import chain, rid
from tests.workers.manager.test_response_store import queued, settle
from tests.workers.manager.test_store_desk import MODEL, act, records, staged_adapter
from wire.store import StoreAction
from workers.manager.adapter_store import AdapterRegistry

__all__ = ["records"]  # the fixture
TENANTS = ("acme", "beta")
OWNER = {"conversation_items": ("conversations", "conversation"),
         "batch_results": ("batches", "batch_id")}


def measured(db: Database, tenant: str) -> dict[str, int]:
    """Each kind's bytes: every record of the tenant's read back, its text encoded."""
    total = dict.fromkeys(KINDS, 0)
    for counted in COUNTED:
        owner = OWNER.get(counted.table)
        whose = f"(SELECT tenant FROM {owner[0]} WHERE id = r.{owner[1]})" if owner \
            else "r.tenant"
        for row in db.query(f"SELECT * FROM {counted.table} AS r WHERE {whose} = ?", (tenant,)):
            total[counted.kind] += sum(len((row[column] or "").encode())
                                       for column in counted.columns)
    return total


def summed(records) -> dict[str, dict[str, int]]:
    kept = {t: stored_by_kind(records.db, t) for t in TENANTS}
    return {t: {kind: kept[t][kind] for kind in KINDS} for t in TENANTS}


def check(records) -> None:
    assert summed(records) == {t: measured(records.db, t) for t in TENANTS}


def test_the_sums_follow_every_change_to_the_records(records) -> None:
    chain(records, 3)
    queued(records, rid(9), tenant="beta")
    check(records)
    assert settle(records, "completed", "beta", rid(9)).ok
    assert act(records, StoreAction.DELETE_RESPONSE, response_id=rid(0)).ok  # handed on
    check(records)
    assert records.responses.expire(int(time.time()) + 10**8) == 3
    chats.keep(records, 1, metadata={"a": "b"})
    chats.keep(records, 2, "beta")
    check(records)
    assert act(records, StoreAction.TAG_CHAT, record=json.dumps(
        {"id": chats.chat_id(1), "metadata": {"longer": "é" * 40}})).ok
    assert act(records, StoreAction.DELETE_CHAT, "beta", response_id=chats.chat_id(2)).ok
    check(records)
    message = conversations.message
    assert conversations.create(records, items=[message(0), message(1)]).ok
    assert conversations.extend(records, [message(2)]).ok
    check(records)
    assert act(records, StoreAction.DELETE_ITEM, record=json.dumps(
        {"conversation": conversations.CONV, "item": message(1)["id"]})).ok
    check(records)
    assert act(records, StoreAction.DELETE_CONVERSATION, response_id=conversations.CONV).ok
    check(records)
    source = batches.batch_file(records, "beta", n=2)
    batch_id, _ = batches.add(records, source.id, "beta", total=2)
    assert batches.keep(records, batch_id, 0, 200, "beta", text="x" * 500).made
    check(records)
    assert act(records, StoreAction.FINISH_BATCH, "beta", batch_id=batch_id,
               name="completed").ok  # its answers go into files
    check(records)
    assert summed(records)["acme"]["chat_completions"] > 0  # not all zero by chance
    assert act(records, StoreAction.DELETE_CHAT, response_id=chats.chat_id(1)).ok
    assert summed(records) == {t: dict.fromkeys(KINDS, 0) for t in TENANTS}


def test_records_kept_before_the_sums_are_summed_by_their_migration(tmp_path) -> None:
    before = Database(db_path(tmp_path), MIGRATIONS[:MIGRATIONS.index(KEPT_BYTES)])
    now = int(time.time())
    with before.transaction() as conn:
        conn.execute("INSERT INTO responses (id, tenant, created_at, expires_at, body, "
                     "conversation, own, request) VALUES (?, 'acme', ?, ?, '{\"é\": 1}', "
                     "'[]', 0, NULL)", (rid(1), now, now + 60))
        conn.execute("INSERT INTO conversations VALUES ('conv_1', 'beta', 1, '{}')")
        conn.executemany("INSERT INTO conversation_items VALUES ('conv_1', ?, ?, ?)",
                         [(n, f"msg_{n}", json.dumps({"n": n})) for n in range(3)])
    before.close()
    after = Database(db_path(tmp_path))
    kept = {(row["tenant"], row["kind"]): row["bytes"] for row in
            after.query("SELECT * FROM kept_bytes")}
    assert kept == {("acme", "responses"): len('{"é": 1}'.encode()) + 2,
                    ("beta", "conversations"): 2 + 3 * len('{"n": 0}')}
    assert {t: measured(after, t) for t in TENANTS} == \
        {"acme": {**dict.fromkeys(KINDS, 0), "responses": 11},
         "beta": {**dict.fromkeys(KINDS, 0), "conversations": 26}}
    after.close()


def on_disk(records, tenant: str) -> dict[str, int]:
    """Its adapters' and files' bytes: every file under its adapters' directory, and each of
    its files' content."""
    files = records.db.query("SELECT path FROM files WHERE tenant = ?", (tenant,))
    return {"adapters": directory_bytes(records.desk.registry.root / tenant),
            "files": sum(Path(row["path"]).stat().st_size for row in files)}


def check_disk(records) -> None:
    kept = {t: stored_by_kind(records.db, t) for t in TENANTS}
    assert {t: {kind: kept[t][kind] for kind in ("adapters", "files")} for t in TENANTS} == \
        {t: on_disk(records, t) for t in TENANTS}


def test_files_and_adapter_versions_are_summed_as_they_are_on_disk(records, tmp_path) -> None:
    lora, ia3 = save_adapter(tmp_path / "a", "lora", 1), save_adapter(tmp_path / "b", "ia3", 2)
    for tenant, source in (("acme", lora), ("acme", ia3), ("acme", lora), ("beta", ia3)):
        assert act(records, StoreAction.ADD_ADAPTER, tenant, name="bot",
                   staged=staged_adapter(records, source)).ok
    first, _ = add_file(records), add_file(records, "beta")
    check_disk(records)
    assert on_disk(records, "acme")["adapters"] > on_disk(records, "beta")["adapters"] > 0
    assert act(records, StoreAction.DELETE_VERSION, model="acme/bot", number=2).ok
    assert act(records, StoreAction.DELETE_FILE, file_id=first.made).ok
    check_disk(records)
    assert act(records, StoreAction.DELETE_MODEL, model="acme/bot").ok
    check_disk(records)
    assert on_disk(records, "acme") == {"adapters": 0, "files": 0}


def test_versions_recorded_before_their_sizes_are_measured_as_the_registry_starts(
        records, tmp_path) -> None:
    source = save_adapter(tmp_path / "a", "lora", 1)
    assert act(records, StoreAction.ADD_ADAPTER, name="bot",
               staged=staged_adapter(records, source)).ok
    with records.db.transaction() as conn:  # as a version recorded before sizes were kept
        conn.execute("UPDATE versions SET bytes = NULL")
    assert stored_by_kind(records.db, "acme")["adapters"] == 0
    AdapterRegistry(records.db, records.desk.registry.root.parent, MODEL)
    check_disk(records)
    assert stored_by_kind(records.db, "acme")["adapters"] == sum(
        (source / name).stat().st_size for name in FILES) > 0

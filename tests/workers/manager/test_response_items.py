"""The index of the items stored responses keep, with the manager's real stores on a data dir:
every item a tenant's unexpired responses keep is found by its id, as reading each response's
JSON finds it, through links, a background response's settling, deleting (its items handed
on) and expiring; another tenant's never; responses kept before the index are indexed by the
migration, items without a string id left out; the lookup reads the index, not every
response."""

from __future__ import annotations

import json
import time

from state.db import Database, db_path
from state.migrations import MIGRATIONS
from state.response_items import KEEPER
from state.response_items import MIGRATION as RESPONSE_ITEMS
from state.responses import RETENTION_S, ResponseReader
from tests.workers.manager.test_response_chain import answered, asked, chain, record, rid
from tests.workers.manager.test_response_store import MESSAGE, queued, settle
from tests.workers.manager.test_store_desk import act, records
from wire.store import StoreAction

__all__ = ["records"]  # the fixture


def read_whole(db: Database, tenant: str) -> dict[str, dict]:
    """Each item with an id that the tenant's unexpired responses keep, by id, read from every
    response's JSON (the reference the index must agree with)."""
    found = {}
    for row in db.query("SELECT conversation, body FROM responses WHERE tenant = ? AND "
                        "expires_at > ?", (tenant, int(time.time()))):
        for item in [*json.loads(row["conversation"]), *json.loads(row["body"])["output"]]:
            if isinstance(item, dict) and isinstance(item.get("id"), str):
                found[item["id"]] = item
    return found


def found(records, tenant: str, ids) -> dict[str, dict | None]:
    return {named: records.responses.found_item(tenant, named) for named in ids}


def test_every_kept_item_is_found_by_its_id_as_reading_them_all_finds_it(records) -> None:
    chain(records, 3)
    theirs = record(5, [], None, created_at=1)  # beta's, expired: kept until swept
    assert act(records, StoreAction.ADD_RESPONSE, "beta", record=json.dumps(theirs)).ok
    queued(records, rid(9))
    assert found(records, "acme", [MESSAGE["id"]]) == {MESSAGE["id"]: None}
    assert settle(records, "completed", response_id=rid(9)).made == rid(9)
    whole = read_whole(records.db, "acme")
    assert set(whole) == {*(f"msg_{way}{t}" for way in ("in", "out") for t in range(3)),
                          "msg_1", MESSAGE["id"]}
    assert found(records, "acme", whole) == whole
    assert found(records, "beta", whole) == {named: None for named in whole} and \
        read_whole(records.db, "beta") == {}
    assert not any(found(records, "beta", ["msg_in5", "msg_out5"]).values())
    assert act(records, StoreAction.DELETE_RESPONSE, response_id=rid(0)).ok  # handed on
    assert found(records, "acme", whole) == whole == read_whole(records.db, "acme")
    for gone in (1, 2, 9):
        assert act(records, StoreAction.DELETE_RESPONSE, response_id=rid(gone)).ok
    assert found(records, "acme", whole) == {named: None for named in whole}
    assert records.responses.expire(int(time.time()) + RETENTION_S + 60) == 1  # beta's
    assert records.db.query("SELECT COUNT(*) FROM response_items")[0][0] == 0


def test_an_expired_response_keeps_no_item_though_not_yet_swept(records) -> None:
    long_ago = int(time.time()) - RETENTION_S - 60
    chain(records, 1, created_at=long_ago)
    assert found(records, "acme", [asked(0)["id"], answered(0)["id"]]) == \
        {asked(0)["id"]: None, answered(0)["id"]: None}


def test_responses_kept_before_the_index_are_indexed_by_its_migration(tmp_path) -> None:
    before = Database(db_path(tmp_path), MIGRATIONS[:MIGRATIONS.index(RESPONSE_ITEMS)])
    odd = ["said", {"type": "message", "id": 7}, {"type": "message"}, asked(1)]
    now = int(time.time())
    with before.transaction() as conn:
        for n, (conversation, output) in enumerate(((odd, [answered(1)]), ([], []))):
            conn.execute("INSERT INTO responses (id, tenant, created_at, expires_at, body, "
                         "conversation, own) VALUES (?, 'acme', ?, ?, ?, ?, 1)",
                         (rid(n), now, now + 60, json.dumps({"output": output}),
                          json.dumps(conversation)))
    before.close()
    after = Database(db_path(tmp_path))
    assert {tuple(row) for row in after.query("SELECT * FROM response_items")} == \
        {("acme", asked(1)["id"], rid(0)), ("acme", answered(1)["id"], rid(0))}
    reader = ResponseReader(after)
    assert (reader.found_item("acme", asked(1)["id"]), reader.found_item("acme", "7")) == \
        (asked(1), None)
    after.close()


def test_a_reference_is_looked_up_in_the_index_not_read_from_every_response(records) -> None:
    plan = [row["detail"] for row in records.db.query(f"EXPLAIN QUERY PLAN {KEEPER}",
                                                      ("acme", "msg_1", 0))]
    assert plan[0] == "SEARCH x USING INDEX response_items_by_id (tenant=? AND id=?)", plan
    assert not any(step.startswith("SCAN") for step in plan), plan

"""Reading files: a tenant's list in the order the files were made (newest first by default),
also within one second of `created_at`, paged by cursors that must name one of its files."""

from __future__ import annotations

import pytest

from state.db import Database, UnknownCursor
from workers.manager.file_store import FileStore


def made_in_one_second(tmp_path) -> tuple[FileStore, list[str]]:
    """Six files of one tenant (a batch file among them) and one of another, all of one second;
    their ids are random, so they sort in no relation to the order they were made."""
    store = FileStore(Database(tmp_path / "state.db"), tmp_path / "data")
    made = [store.create("acme", f"f{i}.jsonl", "batch" if i == 3 else "fine-tune", b"{}\n").id
            for i in range(6)]
    store.create("beta", "b.jsonl", "fine-tune", b"{}\n")
    with store.db.transaction() as conn:
        conn.execute("UPDATE files SET created_at = 1700000000")
    return store, made


def listed(store: FileStore, **page) -> tuple[list[str], bool]:
    page = {"purpose": None, "after": None, "limit": 10, "order": "desc"} | page
    files, more = store.list("acme", **page)
    return [f.id for f in files], more


def test_files_of_one_second_list_in_the_order_they_were_made(tmp_path) -> None:
    store, made = made_in_one_second(tmp_path)
    newest_first = made[::-1]
    assert listed(store) == (newest_first, False)
    assert listed(store, order="asc") == (made, False)
    assert listed(store, limit=2) == (newest_first[:2], True)
    assert listed(store, after=newest_first[1], limit=2) == (newest_first[2:4], True)
    assert listed(store, after=newest_first[3], limit=2) == (newest_first[4:], False)
    assert listed(store, order="asc", after=made[3], limit=5) == (made[4:], False)
    tuning = [i for i in made if i != made[3]]
    assert listed(store, purpose="fine-tune", order="asc", after=made[3]) == (tuning[3:], False)


def test_a_cursor_that_is_not_one_of_the_tenants_files_is_refused(tmp_path) -> None:
    store, _ = made_in_one_second(tmp_path)
    others = store.list("beta", purpose=None, after=None, limit=10, order="desc")[0]
    for cursor in ("file-nothing", others[0].id):
        with pytest.raises(UnknownCursor):
            listed(store, after=cursor)

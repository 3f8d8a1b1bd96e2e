"""Stored responses that go on from one another, at the manager's desk with its real stores: a
response that went on from a kept one keeps only its own items and a link, so a conversation's
room grows with its turns, not their square, and is read back whole along the links; deleting
or expiring a response hands its whole conversation to those that went on from it; a link to
another tenant's response (or one gone) is never made; a quota counts what is kept."""

from __future__ import annotations

import json
import time

import pytest

from state.db import Database, db_path
from state.migrations import MIGRATIONS
from state.responses import RETENTION_S, ResponseReader
from state.usage import stored_bytes
from tests.workers.manager.test_store_desk import act, records
from wire.store import StoreAction

__all__ = ["records"]  # the fixture


def rid(n: int) -> str:
    return f"resp_{n:032x}"


def asked(turn: int) -> dict:
    return {"type": "message", "id": f"msg_in{turn}", "role": "user", "status": "completed",
            "content": [{"type": "input_text", "text": f"question {turn} " + "x" * 200}]}


def answered(turn: int) -> dict:
    return {"type": "message", "id": f"msg_out{turn}", "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": f"answer {turn}", "annotations": []}]}


def record(turn: int, earlier: list, previous: str | None, created_at: int | None = None,
           own: int = 1) -> dict:
    """Turn `turn`'s record as the gateway sends it: the whole conversation, its own last
    (created now, unless `created_at` says when)."""
    created_at = int(time.time()) if created_at is None else created_at
    return {"id": rid(turn), "created_at": created_at, "own": own, "previous": previous,
            "body": {"id": rid(turn), "status": "completed", "output": [answered(turn)]},
            "conversation": [*earlier, asked(turn)]}


def chain(records, turns: int, tenant: str = "acme", created_at: int | None = None) \
        -> list[dict]:
    """`turns` responses, each going on from the one before (a second apart, from
    `created_at`, else now); their records."""
    created_at = int(time.time()) if created_at is None else created_at
    made, earlier, previous = [], [], None
    for turn in range(turns):
        sent = record(turn, earlier, previous, created_at + turn)
        assert act(records, StoreAction.ADD_RESPONSE, tenant, record=json.dumps(sent)).ok
        made.append(sent)
        earlier, previous = [*sent["conversation"], answered(turn)], rid(turn)
    return made


def kept(records, turn: int) -> tuple[list, str | None]:
    row = records.db.query("SELECT conversation, previous FROM responses WHERE id = ?",
                           (rid(turn),))[0]
    return json.loads(row["conversation"]), row["previous"]


def test_a_conversation_keeps_each_turn_once_and_reads_back_whole(records) -> None:
    sent = chain(records, 12)
    for turn, one in enumerate(sent):
        got = records.responses.get(rid(turn), "acme")
        assert got.conversation == one["conversation"] and got.input_items == [asked(turn)]
        assert got.continued() == [*one["conversation"], answered(turn)]
        assert kept(records, turn) == ([asked(turn)], rid(turn - 1) if turn else None)
    bodies = sum(len(json.dumps(one["body"])) for one in sent)
    assert stored_bytes(records.db, "acme") == \
        bodies + sum(len(json.dumps([asked(turn)])) for turn in range(12))
    whole = sum(len(json.dumps(one["conversation"])) for one in sent)
    assert stored_bytes(records.db, "acme") < (bodies + whole) / 3


@pytest.mark.parametrize("gone", [0, 2, 4])
def test_deleting_a_response_hands_its_conversation_to_the_next(records, gone: int) -> None:
    sent = chain(records, 5)
    assert act(records, StoreAction.DELETE_RESPONSE, response_id=rid(gone)).deleted == \
        [rid(gone)]
    assert records.responses.get(rid(gone), "acme") is None
    for turn in (t for t in range(5) if t != gone):
        got = records.responses.get(rid(turn), "acme")
        assert got.conversation == sent[turn]["conversation"]
        assert got.input_items == [asked(turn)]
    if gone < 4:  # the next keeps its whole conversation now, without a link
        assert kept(records, gone + 1) == (sent[gone + 1]["conversation"], None)
    assert records.db.query("SELECT COUNT(*) FROM responses")[0][0] == 4


def test_expiring_hands_each_conversation_on_in_turn(records) -> None:
    now = int(time.time())
    first = now - RETENTION_S + 100  # turn t's retention ends at now + 100 + t
    sent = chain(records, 4, created_at=first)
    assert records.responses.expire(now + 102) == 3  # turns 0..2
    last = records.responses.get(rid(3), "acme")
    assert last.conversation == sent[3]["conversation"] and last.input_items == [asked(3)]
    assert kept(records, 3) == (sent[3]["conversation"], None)


def test_branches_from_one_response_each_keep_it(records) -> None:
    sent = chain(records, 2)
    branch = record(7, [*sent[1]["conversation"], answered(1)], rid(1))
    assert act(records, StoreAction.ADD_RESPONSE, record=json.dumps(branch)).ok
    assert act(records, StoreAction.DELETE_RESPONSE, response_id=rid(1)).ok
    assert act(records, StoreAction.DELETE_RESPONSE, response_id=rid(0)).ok
    assert records.responses.get(rid(7), "acme").conversation == branch["conversation"]


def test_no_link_to_another_tenants_response_or_one_gone(records) -> None:
    theirs = chain(records, 1, tenant="beta")[0]
    mine = record(1, [{"type": "message", "id": "msg_a", "role": "user", "content": "mine"}],
                  rid(0))  # names beta's response as its predecessor
    assert act(records, StoreAction.ADD_RESPONSE, record=json.dumps(mine)).ok
    assert kept(records, 1) == (mine["conversation"], None)
    assert records.responses.get(rid(1), "acme").conversation == mine["conversation"]
    assert act(records, StoreAction.DELETE_RESPONSE, "beta", response_id=rid(0)).ok
    assert records.responses.get(rid(1), "acme").conversation == mine["conversation"]
    assert theirs["conversation"][0] not in records.responses.get(rid(1), "acme").conversation


def test_a_quota_counts_only_what_a_linked_response_keeps(records) -> None:
    sent = chain(records, 6)
    used = stored_bytes(records.db, "acme")
    following = record(6, [*sent[5]["conversation"], answered(5)], rid(5))
    own = len(json.dumps(following["body"])) + len(json.dumps([asked(6)]))
    assert own < len(json.dumps(following["conversation"]))
    assert act(records, StoreAction.ADD_RESPONSE, record=json.dumps(following),
               quota_bytes=used + own).ok
    alone = record(8, following["conversation"], None)  # no link: its whole conversation
    refused = act(records, StoreAction.ADD_RESPONSE, record=json.dumps(alone),
                  quota_bytes=used + 2 * own)
    assert (refused.status, refused.code) == (403, "storage_quota_exceeded")


@pytest.mark.parametrize("previous", ["resp_1", 7, ""])
def test_a_malformed_link_is_refused(records, previous) -> None:
    bad = {**record(0, [], None), "previous": previous}
    answer = act(records, StoreAction.ADD_RESPONSE, record=json.dumps(bad))
    assert (answer.status, answer.code) == (400, "invalid_record")


def test_responses_kept_before_the_links_read_as_they_were(tmp_path) -> None:
    before = Database(db_path(tmp_path), MIGRATIONS[:10])
    whole = [asked(0), answered(0), asked(1)]
    now = int(time.time())
    with before.transaction() as conn:
        conn.execute("INSERT INTO responses (id, tenant, created_at, expires_at, body, "
                     "conversation, own) VALUES (?, 'acme', ?, ?, ?, ?, 1)",
                     (rid(1), now, now + 3600, json.dumps({"id": rid(1), "output": []}),
                      json.dumps(whole)))
    before.close()
    after = Database(db_path(tmp_path))
    got = ResponseReader(after).get(rid(1), "acme")
    assert got.conversation == whole and got.input_items == [asked(1)]
    after.close()

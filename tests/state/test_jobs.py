"""Reading jobs: a tenant's list, newest first, paged by cursors that must name an item."""

from __future__ import annotations

import pytest

from state.db import Database, UnknownCursor
from state.jobs import JobReader
from wire.jobs import JobSpec, NewJob, PeftSpec
from workers.manager.job_store import JobStore


def test_jobs_of_one_second_list_newest_first(tmp_path) -> None:
    db = Database(tmp_path / "state.db")
    store = JobStore(db)
    for job_id in ("ftjob-c", "ftjob-b", "ftjob-a"):  # made in this order; ids sort the other way
        store.create(job_id, NewJob(tenant="acme", model="m", training_file="file", seed=1,
                                    spec=JobSpec(1, 1, 1.0, PeftSpec())))
    with db.transaction() as conn:
        conn.execute("UPDATE jobs SET created_at = 1700000000")  # one second for all
    jobs, more = JobReader(db).list("acme", after=None, limit=2)
    assert [j.id for j in jobs] == ["ftjob-a", "ftjob-b"] and more
    rest, more = JobReader(db).list("acme", after="ftjob-b", limit=2)
    assert [j.id for j in rest] == ["ftjob-c"] and not more


def test_a_cursor_not_in_the_list_is_refused_not_read_as_the_end(tmp_path) -> None:
    """`after` naming nothing of this list (a typo, another tenant's job, another job's event)
    raises, for jobs, events and checkpoints alike; a job's list with a metadata filter pages
    past a cursor the filter leaves out."""
    db = Database(tmp_path / "state.db")
    store = JobStore(db)
    for job_id, tenant, tag in (("ftjob-a", "acme", "x"), ("ftjob-b", "acme", "y"),
                                ("ftjob-c", "acme", "x"), ("ftjob-z", "beta", "x")):
        store.create(job_id, NewJob(tenant=tenant, model="m", training_file="file", seed=1,
                                    spec=JobSpec(1, 1, 1.0, PeftSpec()), metadata={"t": tag}))
    reader = JobReader(db)
    past_b, _ = reader.list("acme", after="ftjob-b", limit=10, metadata={"t": "x"})
    assert [j.id for j in past_b] == ["ftjob-a"]
    for event in ("one", "two"):
        store.event("ftjob-a", event)
    store.event("ftjob-c", "elsewhere")
    newest = reader.events("ftjob-a", after=None, limit=1)[0][0]["id"]
    assert [e["message"] for e in reader.events("ftjob-a", after=newest, limit=5)[0]] == ["one"]
    checkpoint = store.add_checkpoint("ftjob-a", 1, 1, "m:ckpt", {}, "/p")
    assert reader.checkpoints("ftjob-a", after=checkpoint)[0] == []
    other_event = reader.events("ftjob-c", after=None, limit=1)[0][0]["id"]
    for unknown in (lambda: reader.list("acme", after="ftjob-z", limit=5),
                    lambda: reader.list("acme", after="ftjob-nope", limit=5),
                    lambda: reader.events("ftjob-a", after=other_event, limit=5),
                    lambda: reader.checkpoints("ftjob-c", after=checkpoint)):
        with pytest.raises(UnknownCursor):
            unknown()

"""Reading jobs: a tenant's list, newest first."""

from __future__ import annotations

from state.db import Database
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

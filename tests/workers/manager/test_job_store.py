"""The job state machine: the allowed moves, applied atomically by the one store that changes a
job's status (the worker manager's)."""

from __future__ import annotations

import pytest

from state.db import Database
from state.jobs import new_id
from wire.jobs import JobSpec, NewJob, PeftSpec
from workers.manager.job_states import MOVES, STATUSES, TERMINAL, IllegalMove, can_move, sources
from workers.manager.job_store import JobStore

EXPECTED = {
    ("validating_files", "queued"), ("validating_files", "failed"),
    ("validating_files", "cancelled"),
    ("queued", "running"), ("queued", "paused"), ("queued", "cancelled"), ("queued", "failed"),
    ("running", "succeeded"), ("running", "failed"), ("running", "cancelled"),
    ("running", "paused"), ("running", "queued"),
    ("paused", "queued"), ("paused", "cancelled"),
}


def test_the_allowed_moves_are_exactly_these() -> None:
    allowed = {(a, b) for a in STATUSES for b in STATUSES if can_move(a, b)}
    assert allowed == EXPECTED
    assert all(not MOVES[status] for status in TERMINAL)
    assert set(sources("paused")) == {"queued", "running"}


@pytest.fixture()
def store(tmp_path) -> JobStore:
    return JobStore(Database(tmp_path / "state.db"))


def new_job(store: JobStore) -> str:
    return store.create(new_id("ftjob"), NewJob(tenant="acme", model="tiny-llama",
                                                 training_file="file-1", seed=1,
                                                 spec=JobSpec(1, 1, 1.0, PeftSpec()))).id


def test_the_store_refuses_what_the_machine_forbids(store: JobStore) -> None:
    job = new_job(store)
    assert not store.move(job, "running")  # validating_files -> running: not a move
    assert store.get(job).status == "validating_files"
    assert store.move(job, "queued") and store.move(job, "running")
    assert store.move(job, "succeeded")
    finished = store.get(job)
    assert finished.status == "succeeded" and finished.finished_at is not None
    for target in STATUSES:  # nothing leaves a final status
        assert not store.move(job, target)
    with pytest.raises(IllegalMove):
        store.update(job, status="queued")  # only `move` changes a status
    with pytest.raises(IllegalMove):
        store.move(job, "exploded")


def test_a_move_from_a_status_left_meanwhile_does_nothing(store: JobStore) -> None:
    job = new_job(store)
    store.move(job, "queued")
    claimed = store.claim(1)
    assert [j.id for j in claimed] == [job]
    assert store.get(job).status == "running"
    assert store.move(job, "paused")  # running -> paused is allowed
    assert not store.move(job, "running")  # paused -> running is not: resume queues it
    assert store.move(job, "queued") and store.get(job).queued_at is not None

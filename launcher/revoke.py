"""`symbiosis tenants revoke NAME`: the tenant's keys go from the tenants file, and its work in
progress stops: its unfinished fine-tuning jobs and running batches are cancelled, through the
running worker manager (a running job's trainer saves a checkpoint and stops first) or, with
none running, as the data dir's writer. Its files, models and stored responses stay (a tenant
created again under the same name finds them)."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from pathlib import Path

from launcher.records import ask
from state.batches import BatchReader, BatchRecord
from state.db import Database, db_path
from wire.jobs import JobAction, JobCommand, JobState
from wire.store import StoreAction, StoreCommand
from workers.manager.batch_store import BatchStore
from workers.manager.file_store import FileStore
from workers.manager.job_store import JobStore
from workers.manager.records import Busy, writing


class Unanswered(Exception):
    pass


def cancel_work(data_dir: Path, tenant: str) -> list[str]:
    """The ids of the tenant's jobs and batches cancelled (none without a database)."""
    if not db_path(data_dir).exists():
        return []
    try:
        with writing(data_dir), _database(data_dir) as db:
            jobs = JobStore(db)
            batches = BatchStore(db, FileStore(db, data_dir))
            return [*(job_id for job_id in jobs.unfinished(tenant)
                      if _cancel_idle(jobs, job_id)),
                    *(batch.id for batch in _running(batches, tenant)
                      if batches.cancel(tenant, batch.id))]
    except Busy as exc:
        endpoint = str(exc)
    if not endpoint:
        raise Unanswered("another tool is changing this data dir's records; try again")
    with _database(data_dir, read_only=True) as db:
        unfinished, running = JobStore(db).unfinished(tenant), \
            _running(BatchReader(db), tenant)
    return [*(job_id for job_id in unfinished if _cancel_at(endpoint, job_id)),
            *(batch.id for batch in running if _cancel_batch_at(endpoint, tenant, batch.id))]


@contextlib.contextmanager
def _database(data_dir: Path, read_only: bool = False) -> Iterator[Database]:
    db = Database(db_path(data_dir), read_only=read_only)
    try:
        yield db
    finally:
        db.close()


def _running(batches: BatchReader, tenant: str) -> list[BatchRecord]:
    return [b for b in batches.active() if b.tenant == tenant and b.status == "in_progress"]


def _cancel_batch_at(endpoint: str, tenant: str, batch_id: str) -> bool:
    answer = ask(endpoint, StoreCommand(id=uuid.uuid4().hex, action=StoreAction.CANCEL_BATCH,
                                        tenant=tenant, batch_id=batch_id))
    if answer is None:
        raise Unanswered(f"the running worker manager (at {endpoint}) did not answer about "
                         f"batch {batch_id}")
    return answer.ok


def _cancel_idle(jobs: JobStore, job_id: str) -> bool:
    """With no manager running no trainer runs either: a job left running by a stopped stack
    is cancelled as a queued one is."""
    if not jobs.move(job_id, "cancelled"):
        return False
    jobs.event(job_id, "Job cancelled: its tenant was revoked")
    return True


def _cancel_at(endpoint: str, job_id: str) -> bool:
    """Whether the manager at `endpoint` cancelled the job (False: it had finished)."""
    state = ask(endpoint, JobCommand(uuid.uuid4().hex, job_id, JobAction.CANCEL), JobState)
    if state is None:
        raise Unanswered(f"the running worker manager (at {endpoint}) did not answer about "
                         f"job {job_id}")
    return state.moved

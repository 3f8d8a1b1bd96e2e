"""`symbiosis tenants revoke NAME`: the tenant's keys go from the tenants file, and its work in
progress stops: its unfinished fine-tuning jobs, running batches and pending background
responses are cancelled, through the
running worker manager (a running job's trainer saves a checkpoint and stops first) or, with
none running, as the data dir's writer. Its files, models, stored responses, chat completions
and conversations stay (a tenant created again under the same name finds them)."""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Iterator
from pathlib import Path

from launcher.records import ask
from state.batches import BatchReader, BatchRecord
from state.db import Database, db_path
from state.responses import ResponseReader, StoredResponse
from state.storage import Reserve
from wire.jobs import JobAction, JobCommand, JobState
from wire.store import StoreAction, StoreAnswer, StoreCommand
from workers.manager.batch_store import BatchStore
from workers.manager.file_store import FileStore
from workers.manager.job_store import JobStore
from workers.manager.records import Busy, writing
from workers.manager.response_store import ResponseStore


class Unanswered(Exception):
    pass


def cancel_work(data_dir: Path, tenant: str) -> list[str]:
    """The ids of the tenant's jobs, batches and background responses cancelled (none
    without a database)."""
    if not db_path(data_dir).exists():
        return []
    try:
        with writing(data_dir), _database(data_dir) as db:
            jobs = JobStore(db)
            batches = BatchStore(db, FileStore(db, data_dir))
            responses = ResponseStore(db, Reserve(data_dir))
            return [*(job_id for job_id in jobs.unfinished(tenant)
                      if _cancel_idle(jobs, job_id)),
                    *(batch.id for batch in _running(batches, tenant)
                      if batches.cancel(tenant, batch.id)),
                    *(made.id for made in _pending(responses, tenant)
                      if responses.settle(tenant, _cancelled(made)))]
    except Busy as exc:
        endpoint = str(exc)
    if not endpoint:
        raise Unanswered("another tool is changing this data dir's records; try again")
    with _database(data_dir, read_only=True) as db:
        unfinished, running, pending = JobStore(db).unfinished(tenant), \
            _running(BatchReader(db), tenant), _pending(ResponseReader(db), tenant)
    return [*(job_id for job_id in unfinished if _cancel_at(endpoint, job_id)),
            *(batch.id for batch in running if _cancel_batch_at(endpoint, tenant, batch.id)),
            *(made.id for made in pending if _store_at(endpoint, StoreCommand(
                id=uuid.uuid4().hex, action=StoreAction.SETTLE_RESPONSE, tenant=tenant,
                record=_cancelled(made))).made)]


@contextlib.contextmanager
def _database(data_dir: Path, read_only: bool = False) -> Iterator[Database]:
    db = Database(db_path(data_dir), read_only=read_only)
    try:
        yield db
    finally:
        db.close()


def _running(batches: BatchReader, tenant: str) -> list[BatchRecord]:
    return [b for b in batches.active() if b.tenant == tenant and b.status == "in_progress"]


def _pending(responses: ResponseReader, tenant: str) -> list[StoredResponse]:
    return [made for made in responses.pending() if made.tenant == tenant]


def _cancelled(made: StoredResponse) -> str:
    return json.dumps({**made.body, "status": "cancelled"})


def _cancel_batch_at(endpoint: str, tenant: str, batch_id: str) -> bool:
    return _store_at(endpoint, StoreCommand(id=uuid.uuid4().hex, action=StoreAction.CANCEL_BATCH,
                                            tenant=tenant, batch_id=batch_id)).ok


def _store_at(endpoint: str, command: StoreCommand) -> StoreAnswer:
    answer = ask(endpoint, command)
    if answer is None:
        raise Unanswered(f"the running worker manager (at {endpoint}) did not answer about "
                         f"{command.batch_id or 'a background response'}")
    return answer


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

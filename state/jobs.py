"""Fine-tuning jobs, their events and checkpoints, in SQLite.

A job's status changes only through `move`, by the state machine of `state.job_states`, applied
atomically (a move from a status the job has left meanwhile does nothing and says so). Pausing or
cancelling a running job is a message to its trainer (`wire.jobs`), not a field here.
"""

from __future__ import annotations

import json
import secrets
import time
from dataclasses import dataclass, field

from state.db import Database
from state.job_spec import JobSpec
from state.job_states import TERMINAL, IllegalMove, sources
from wire.jobs import NewJob

__all__ = ["TERMINAL", "JobRecord", "JobStore"]


def new_id(prefix: str) -> str:
    return f"{prefix}-{secrets.token_urlsafe(18).replace('-', 'x').replace('_', 'y')[:24]}"


@dataclass
class JobRecord:
    id: str
    tenant: str
    created_at: int
    status: str
    model: str
    training_file: str
    validation_file: str | None
    suffix: str | None
    seed: int
    hyperparameters: dict
    method: dict
    metadata: dict | None = None
    fine_tuned_model: str | None = None
    finished_at: int | None = None
    error: dict | None = None
    trained_tokens: int | None = None
    result_files: list[str] = field(default_factory=list)
    control: str | None = None
    attempts: int = 0
    queued_at: float | None = None
    priority: int = 0  # a higher one preempts lower running jobs when the slots are full
    gates: dict | None = None  # quality gate results of a finished job

    @classmethod
    def from_row(cls, row) -> JobRecord:
        data = dict(row)
        for key in ("hyperparameters", "method", "metadata", "error", "result_files", "gates"):
            if data[key] is not None:
                data[key] = json.loads(data[key])
        return cls(**data)

    @property
    def spec(self) -> JobSpec:
        return JobSpec.from_stored(self.hyperparameters, self.method)

    @property
    def model_id(self) -> str:
        return f"ft:{self.model}:{self.tenant}:{self.suffix or ''}:{self.id}"

    def public(self) -> dict:
        supervised = {"hyperparameters": self.hyperparameters}
        return {
            "id": self.id, "object": "fine_tuning.job", "created_at": self.created_at,
            "error": self.error, "fine_tuned_model": self.fine_tuned_model,
            "finished_at": self.finished_at, "hyperparameters": self.hyperparameters,
            "model": self.method.get("init_model") or self.model,
            "organization_id": self.tenant,
            "result_files": self.result_files, "seed": self.seed, "status": self.status,
            "trained_tokens": self.trained_tokens, "training_file": self.training_file,
            "priority": self.priority, "gates": self.gates,
            "validation_file": self.validation_file, "estimated_finish": None,
            "integrations": [], "metadata": self.metadata,
            "method": {"type": "supervised", "supervised": supervised},
            "peft": {k: v for k, v in self.method.items() if k != "init_adapter"},  # a path
        }


class JobStore:
    def __init__(self, db: Database) -> None:
        self.db = db

    # -- jobs -----------------------------------------------------------------------------------

    def create(self, job_id: str, new: NewJob) -> JobRecord:
        """Store a new job (validating its files) under `job_id`; a job already stored under
        it (the same command again) is returned as it is."""
        hyperparameters, method = new.spec.hyperparameters(), new.spec.peft_dict()
        job = JobRecord(job_id, new.tenant, int(time.time()), "validating_files", new.model,
                        new.training_file, new.validation_file, new.suffix, new.seed,
                        hyperparameters, method, new.metadata, priority=new.priority)
        with self.db.transaction() as conn:
            conn.execute(
                "INSERT OR IGNORE INTO jobs (id, tenant, created_at, status, model, "
                "training_file, validation_file, suffix, seed, hyperparameters, method, "
                "metadata, priority) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (job.id, job.tenant, job.created_at, job.status, job.model, job.training_file,
                 job.validation_file, job.suffix, job.seed, json.dumps(hyperparameters),
                 json.dumps(method), None if new.metadata is None else json.dumps(new.metadata),
                 job.priority))
        return self.get(job_id)

    def get(self, job_id: str, tenant: str | None = None) -> JobRecord | None:
        sql, params = "SELECT * FROM jobs WHERE id = ?", [job_id]
        if tenant is not None:
            sql += " AND tenant = ?"
            params.append(tenant)
        rows = self.db.query(sql, tuple(params))
        return JobRecord.from_row(rows[0]) if rows else None

    def list(self, tenant: str, *, after: str | None, limit: int,
             metadata: dict[str, str] | None = None) -> tuple[list[JobRecord], bool]:
        rows = [JobRecord.from_row(r) for r in self.db.query(
            "SELECT * FROM jobs WHERE tenant = ? ORDER BY created_at DESC, id DESC", (tenant,))]
        if metadata:
            rows = [j for j in rows if all((j.metadata or {}).get(k) == v
                                           for k, v in metadata.items())]
        if after:
            ids = [j.id for j in rows]
            rows = rows[ids.index(after) + 1:] if after in ids else []
        return rows[:limit], len(rows) > limit

    def update(self, job_id: str, **fields: object) -> None:
        """Fields other than the status (which only `move` changes)."""
        if "status" in fields:
            raise IllegalMove("a job's status changes only through JobStore.move")
        self._update(job_id, None, fields)

    def move(self, job_id: str, status: str, **fields: object) -> bool:
        """Move the job to `status` if the state machine allows it from where the job is now
        (atomically); False when it does not (the job is elsewhere, or gone)."""
        return self._update(job_id, sources(status), {"status": status, **fields})

    def _update(self, job_id: str, allowed: tuple[str, ...] | None, fields: dict) -> bool:
        if fields.get("status") in TERMINAL:
            fields.setdefault("finished_at", int(time.time()))
        if fields.get("status") == "queued":
            fields.setdefault("queued_at", time.time())
        for key in ("error", "result_files", "hyperparameters", "gates"):
            if key in fields and fields[key] is not None:
                fields[key] = json.dumps(fields[key])
        sql = "UPDATE jobs SET " + ", ".join(f"{k} = ?" for k in fields) + " WHERE id = ?"
        params = [*fields.values(), job_id]
        if allowed is not None:
            sql += f" AND status IN ({', '.join('?' for _ in allowed)})"
            params += list(allowed)
        with self.db.transaction() as conn:
            return conn.execute(sql, params).rowcount > 0

    def claim(self, max_running: int, slots: int | None = None) -> list[JobRecord]:
        """Mark queued jobs running, up to `max_running` in all and `slots` now: the highest
        priority first, then fairly across tenants (the tenant with the fewest running jobs
        first, then the longest waiting)."""
        claimed = []
        with self.db.transaction() as conn:
            running: dict[str, int] = {}
            for row in conn.execute("SELECT tenant FROM jobs WHERE status = 'running'"):
                running[row["tenant"]] = running.get(row["tenant"], 0) + 1
            queued = [JobRecord.from_row(r) for r in conn.execute(
                "SELECT * FROM jobs WHERE status = 'queued' ORDER BY queued_at, created_at")]
            while queued and sum(running.values()) < max_running and \
                    (slots is None or len(claimed) < slots):
                job = min(queued, key=lambda j: (-j.priority, running.get(j.tenant, 0),
                                                 j.queued_at or 0))
                queued.remove(job)
                running[job.tenant] = running.get(job.tenant, 0) + 1
                conn.execute("UPDATE jobs SET status = 'running', attempts = attempts + 1 "
                             "WHERE id = ? AND status = 'queued'", (job.id,))
                job.status, job.attempts = "running", job.attempts + 1
                claimed.append(job)
        return claimed

    def count_by_status(self) -> dict[str, int]:
        counts = dict.fromkeys(("validating_files", "queued", "running", "paused", "succeeded",
                                "failed", "cancelled"), 0)
        for row in self.db.query("SELECT status, COUNT(*) AS n FROM jobs GROUP BY status"):
            counts[row["status"]] = row["n"]
        return counts

    def using_file(self, file_id: str, tenant: str) -> list[str]:
        """Unfinished jobs (they will still read it) that train or validate on `file_id`."""
        rows = self.db.query(
            "SELECT id FROM jobs WHERE tenant = ? AND (training_file = ? OR validation_file = ?) "
            f"AND status NOT IN ({', '.join('?' * len(TERMINAL))}) ORDER BY id",
            (tenant, file_id, file_id, *TERMINAL))
        return [row["id"] for row in rows]

    def using_model(self, model_id: str, tenant: str) -> list[str]:
        """Unfinished jobs that continue training a version of `model_id` (or the version
        `model_id` names): they will still read its adapter."""
        rows = self.db.query(
            "SELECT id, method FROM jobs WHERE tenant = ? "
            f"AND status NOT IN ({', '.join('?' * len(TERMINAL))}) ORDER BY id",
            (tenant, *TERMINAL))
        starts = [(row["id"], json.loads(row["method"]).get("init_model") or "") for row in rows]
        return [job_id for job_id, start in starts
                if model_id in (start, start.rpartition("@")[0])]

    def with_status(self, status: str) -> list[JobRecord]:
        return [JobRecord.from_row(r)
                for r in self.db.query("SELECT * FROM jobs WHERE status = ?", (status,))]

    # -- events and checkpoints ----------------------------------------------------------------

    def event(self, job_id: str, message: str, *, level: str = "info", type: str = "message",
              data: dict | None = None) -> None:
        with self.db.transaction() as conn:
            conn.execute("INSERT INTO events (id, job_id, created_at, level, message, type, data)"
                         " VALUES (?, ?, ?, ?, ?, ?, ?)",
                         (new_id("ftevent"), job_id, int(time.time()), level, message, type,
                          None if data is None else json.dumps(data)))

    def forget_steps_after(self, job_id: str, step: int) -> int:
        """Drop the metrics events of steps after `step` (a resume from an older checkpoint
        redoes them; their events come again). Returns how many went."""
        with self.db.transaction() as conn:
            return conn.execute(
                "DELETE FROM events WHERE job_id = ? AND type = 'metrics' AND data IS NOT NULL "
                "AND json_extract(data, '$.step') > ?", (job_id, step)).rowcount

    def events(self, job_id: str, *, after: str | None, limit: int) -> tuple[list[dict], bool]:
        sql, params = "SELECT * FROM events WHERE job_id = ?", [job_id]
        if after:
            sql += " AND seq < (SELECT seq FROM events WHERE id = ?)"
            params.append(after)
        rows = self.db.query(sql + " ORDER BY seq DESC LIMIT ?", (*params, limit + 1))
        events = [{"id": r["id"], "object": "fine_tuning.job.event",
                   "created_at": r["created_at"], "level": r["level"], "message": r["message"],
                   "type": r["type"], "data": json.loads(r["data"]) if r["data"] else None}
                  for r in rows[:limit]]
        return events, len(rows) > limit

    def add_checkpoint(self, job_id: str, step: int, epoch: int, model: str, metrics: dict,
                       path: str) -> str:
        checkpoint_id = new_id("ftckpt")
        with self.db.transaction() as conn:
            conn.execute("INSERT INTO checkpoints VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                         (checkpoint_id, job_id, int(time.time()), step, epoch, model,
                          json.dumps(metrics), path))
        return checkpoint_id

    def checkpoints(self, job_id: str, *, after: str | None = None,
                    limit: int = 10) -> tuple[list[dict], bool]:
        rows = self.db.query("SELECT * FROM checkpoints WHERE job_id = ? "
                             "ORDER BY step DESC, created_at DESC", (job_id,))
        items = [{"id": r["id"], "object": "fine_tuning.job.checkpoint",
                  "created_at": r["created_at"], "fine_tuned_model_checkpoint": r["model"],
                  "fine_tuning_job_id": job_id, "step_number": r["step"],
                  "metrics": json.loads(r["metrics"]), "epoch": r["epoch"]}
                 for r in rows]
        if after:
            ids = [c["id"] for c in items]
            items = items[ids.index(after) + 1:] if after in ids else []
        return items[:limit], len(items) > limit

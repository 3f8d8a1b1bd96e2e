"""Fine-tuning jobs, their events and checkpoints, as stored in SQLite, and the queries that
read them (the gateway's view). The worker manager alone writes them
(`workers.manager.job_store.JobStore`)."""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass, field

from state.db import Database, UnknownCursor, after_cursor
from wire.jobs import TERMINAL, JobSpec

__all__ = ["TERMINAL", "JobReader", "JobRecord", "new_id"]


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
        method = self.spec.method
        shared = {k: v for k, v in self.hyperparameters.items() if k != "beta"}  # OpenAI's
        return {
            "id": self.id, "object": "fine_tuning.job", "created_at": self.created_at,
            "error": self.error, "fine_tuned_model": self.fine_tuned_model,
            "finished_at": self.finished_at, "hyperparameters": shared,
            "model": self.method.get("init_model") or self.model,
            "organization_id": self.tenant,
            "result_files": self.result_files, "seed": self.seed, "status": self.status,
            "trained_tokens": self.trained_tokens, "training_file": self.training_file,
            "priority": self.priority, "gates": self.gates,
            "validation_file": self.validation_file, "estimated_finish": None,
            "integrations": [], "metadata": self.metadata,
            "method": {"type": method, method: {"hyperparameters": self.hyperparameters}},
            "peft": {k: v for k, v in self.method.items() if k != "init_adapter"},  # a path
        }


class JobReader:
    def __init__(self, db: Database) -> None:
        self.db = db

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
            "SELECT * FROM jobs WHERE tenant = ? ORDER BY created_at DESC, rowid DESC",  # newest
            (tenant,))]  # first, also within one second (created_at is whole seconds)
        rows = after_cursor(rows, [j.id for j in rows], after)
        if metadata:
            rows = [j for j in rows if all((j.metadata or {}).get(k) == v
                                           for k, v in metadata.items())]
        return rows[:limit], len(rows) > limit

    def count_by_status(self) -> dict[str, int]:
        counts = dict.fromkeys(("validating_files", "queued", "running", "paused", "succeeded",
                                "failed", "cancelled"), 0)
        for row in self.db.query("SELECT status, COUNT(*) AS n FROM jobs GROUP BY status"):
            counts[row["status"]] = row["n"]
        return counts

    def unfinished(self, tenant: str) -> list[str]:
        """The ids of the tenant's jobs not in a final status."""
        rows = self.db.query(f"SELECT id FROM jobs WHERE tenant = ? AND status NOT IN "
                             f"({', '.join('?' * len(TERMINAL))}) ORDER BY id",
                             (tenant, *TERMINAL))
        return [row["id"] for row in rows]

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

    def events(self, job_id: str, *, after: str | None, limit: int) -> tuple[list[dict], bool]:
        sql, params = "SELECT * FROM events WHERE job_id = ?", [job_id]
        if after:
            if not self.db.query("SELECT 1 FROM events WHERE id = ? AND job_id = ?",
                                 (after, job_id)):
                raise UnknownCursor(after)
            sql += " AND seq < (SELECT seq FROM events WHERE id = ?)"
            params.append(after)
        rows = self.db.query(sql + " ORDER BY seq DESC LIMIT ?", (*params, limit + 1))
        events = [{"id": r["id"], "object": "fine_tuning.job.event",
                   "created_at": r["created_at"], "level": r["level"], "message": r["message"],
                   "type": r["type"], "data": json.loads(r["data"]) if r["data"] else None}
                  for r in rows[:limit]]
        return events, len(rows) > limit

    def checkpoints(self, job_id: str, *, after: str | None = None,
                    limit: int = 10) -> tuple[list[dict], bool]:
        rows = self.db.query("SELECT * FROM checkpoints WHERE job_id = ? "
                             "ORDER BY step DESC, created_at DESC", (job_id,))
        items = [{"id": r["id"], "object": "fine_tuning.job.checkpoint",
                  "created_at": r["created_at"], "fine_tuned_model_checkpoint": r["model"],
                  "fine_tuning_job_id": job_id, "step_number": r["step"],
                  "metrics": json.loads(r["metrics"]), "epoch": r["epoch"]}
                 for r in rows]
        items = after_cursor(items, [c["id"] for c in items], after)
        return items[:limit], len(items) > limit

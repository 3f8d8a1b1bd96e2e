"""The jobs table's one writer, the worker manager: a job stored, its status moved by the state
machine of `workers.manager.job_states` (atomically: a move from a status the job has left
meanwhile does nothing and says so), queued jobs claimed, events and checkpoints added. Pausing
or cancelling a running job is a message to its trainer (`wire.jobs`), not a field here."""

from __future__ import annotations

import json
import time
from collections.abc import Callable

from state.jobs import TERMINAL, JobReader, JobRecord, new_id
from wire.jobs import NewJob
from workers.manager.job_states import IllegalMove, sources


class JobStore(JobReader):
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

    def claim(self, max_running: int, slots: int | None = None,
              fits: Callable[[JobRecord], bool] | None = None) -> list[JobRecord]:
        """Mark queued jobs running, up to `max_running` in all and `slots` now: the highest
        priority first, then fairly across tenants (the tenant with the fewest running jobs
        first, then the longest waiting); the first that does not `fits` and every one after
        it wait (none overtakes it)."""
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
                if fits is not None and not fits(job):
                    break
                queued.remove(job)
                running[job.tenant] = running.get(job.tenant, 0) + 1
                conn.execute("UPDATE jobs SET status = 'running', attempts = attempts + 1 "
                             "WHERE id = ? AND status = 'queued'", (job.id,))
                job.status, job.attempts = "running", job.attempts + 1
                claimed.append(job)
        return claimed

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

    def has_checkpoint(self, job_id: str, step: int) -> bool:
        return bool(self.db.query("SELECT 1 FROM checkpoints WHERE job_id = ? AND step = ?",
                                  (job_id, step)))

    def add_checkpoint(self, job_id: str, step: int, epoch: int, model: str, metrics: dict,
                       path: str) -> str:
        checkpoint_id = new_id("ftckpt")
        with self.db.transaction() as conn:
            conn.execute("INSERT INTO checkpoints VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                         (checkpoint_id, job_id, int(time.time()), step, epoch, model,
                          json.dumps(metrics), path))
        return checkpoint_id

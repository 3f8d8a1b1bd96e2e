"""The manager's ledger of trainer reports, with a real job store, file store and adapter
registry: what it records, and what it refuses (a path outside the job's own directory)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.job_spec import JobSpec, PeftSpec
from state.db import Database
from state.jobs import new_id
from tests.e2e.adapters import save_adapter
from wire.jobs import JobStatus, NewJob, TrainerCheckpoint, TrainerFinished, TrainerStarted
from workers.manager.adapter_store import AdapterRegistry
from workers.manager.file_store import FileStore
from workers.manager.job_ledger import JobLedger
from workers.manager.job_store import JobStore

MODEL = "tiny-llama"


@pytest.fixture()
def ledger(tmp_path) -> JobLedger:
    db = Database(tmp_path / "state.db")
    return JobLedger(JobStore(db), FileStore(db, tmp_path), tmp_path)


def running(ledger: JobLedger) -> str:
    job = ledger.create(new_id("ftjob"), NewJob(
        tenant="acme", model=MODEL, training_file="file-x", suffix="s", seed=1,
        spec=JobSpec(1, 2, 1.0, PeftSpec(register_as="memo"))))
    assert job.status == "queued" and ledger.jobs.move(job.id, "running")
    return job.id


def messages(ledger: JobLedger, job_id: str) -> list[str]:
    return [e["message"] for e in ledger.jobs.events(job_id, after=None, limit=50)[0]]


def test_a_finished_job_is_registered_stored_and_succeeds(ledger, tmp_path) -> None:
    job_id = running(ledger)
    assert ledger.record(TrainerStarted(job_id, 0, "10 examples")) is None
    step = save_adapter(tmp_path / "jobs" / job_id / "checkpoints" / "step-5", "lora", 1)
    assert ledger.record(TrainerCheckpoint(job_id, 5, 1, {"train_loss": 1.5}, str(step))) is None
    result = save_adapter(tmp_path / "jobs" / job_id / "result", "lora", 2)
    gates = {"passed": False, "checks": []}
    status = ledger.record(TrainerFinished(job_id, str(result), gates, {"job_id": job_id}, 640,
                                           b"step,train_loss\n5,1.5\n"))
    assert status == JobStatus.SUCCEEDED
    job = ledger.jobs.get(job_id)
    assert (job.status, job.trained_tokens, job.gates) == ("succeeded", 640, gates)
    registry = AdapterRegistry(ledger.jobs.db, tmp_path, MODEL)
    assert registry.get(job.fine_tuned_model).in_service == 0  # it failed its gates
    assert registry.get(f"{job.model_id}:ckpt-step-5") is not None
    assert [v.job_id for v in registry.versions.list("acme/memo")] == [job_id]
    results = ledger.files.get(job.result_files[0], "acme")
    assert Path(results.path).read_bytes() == b"step,train_loss\n5,1.5\n"
    said = messages(ledger, job_id)
    assert said[0] == "The job has successfully completed"
    assert "Fine-tuning job started: 10 examples" in said
    assert any(m.startswith("Registered as acme/memo") and "candidate" in m for m in said)


def test_paths_outside_the_jobs_directory_are_refused(ledger, tmp_path) -> None:
    job_id = running(ledger)
    elsewhere = save_adapter(tmp_path / "elsewhere", "lora", 3)
    assert ledger.record(TrainerCheckpoint(job_id, 2, 1, {}, str(elsewhere))) is None
    assert ledger.jobs.checkpoints(job_id, limit=10)[0] == []  # the job goes on
    assert "outside the job's directory" in messages(ledger, job_id)[0]
    sneaky = tmp_path / "jobs" / job_id / ".." / ".." / "elsewhere"
    status = ledger.record(TrainerFinished(job_id, str(sneaky), {"passed": True}, {}, 1, b""))
    assert status == JobStatus.FAILED
    job = ledger.jobs.get(job_id)
    assert job.error["code"] == "result_not_stored" and job.fine_tuned_model is None
    assert AdapterRegistry(ledger.jobs.db, tmp_path, MODEL).get(job.model_id) is None


def test_a_checkpoint_told_again_by_a_resuming_trainer_is_recorded_once(ledger,
                                                                          tmp_path) -> None:
    """A trainer resuming tells every listed checkpoint on its disk again (a crash may have come
    between a save and its record): one recorded before stays one, with one event, and its model,
    deleted by its tenant meanwhile, stays deleted; one not recorded is recorded and served."""
    job_id = running(ledger)
    steps = {n: save_adapter(tmp_path / "jobs" / job_id / "checkpoints" / f"step-{n}", "lora", n)
             for n in (5, 10)}
    ledger.record(TrainerCheckpoint(job_id, 5, 1, {"train_loss": 1.5}, str(steps[5])))
    registry, model = AdapterRegistry(ledger.jobs.db, tmp_path, MODEL), ledger.jobs.get(job_id)
    assert registry.delete(f"{model.model_id}:ckpt-step-5")
    ledger.record(TrainerStarted(job_id, 10, "10 examples"))
    for n in (5, 10):
        ledger.record(TrainerCheckpoint(job_id, n, n // 5, {"train_loss": 2.0}, str(steps[n])))
    listed = ledger.jobs.checkpoints(job_id, limit=10)[0]
    assert [(c["step_number"], c["metrics"]["train_loss"]) for c in listed] == [(10, 2.0),
                                                                               (5, 1.5)]
    said = messages(ledger, job_id)
    assert [m.startswith("Checkpoint created at step 5:") for m in said].count(True) == 1
    assert said[0].startswith("Checkpoint created at step 10:")
    assert registry.get(f"{model.model_id}:ckpt-step-5") is None
    assert registry.get(f"{model.model_id}:ckpt-step-10") is not None

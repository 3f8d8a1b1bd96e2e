"""A DPO job in a trainer (the manager's own ledger behind a stand-in socket): it starts at the
reference (its first step's loss log 2), its validation loss falls below the starting model's,
and a job resumed from a checkpoint mid-way keeps the reference of the model it started from: it
trains the adapter the uninterrupted job trained. A pause or cancel during the reference pass
stops the job there, before its first step."""

from __future__ import annotations

import math
import shutil
import time

import pytest

from tests.e2e.jobs import ANSWER, TOPICS
from tests.workers.training.test_trainer import (
    MODEL,
    make_job,
    manager,
    tokenizer,
    trained_adapter,
)
from wire.jobs import JobAction, TrainerControl, TrainerEvent
from workers.training.checkpoint import checkpoint_root, latest
from workers.training.control import ControlChannel
from workers.training.runner import Trainer, run
from workers.training.stops import RETRY

__all__ = ["manager", "tokenizer"]  # the fixtures


def preferences(topics: list[str]) -> list[dict]:
    return [{"input": {"messages": [{"role": "user", "content": f"Tell me about {topic}."}]},
             "preferred_output": [{"role": "assistant", "content": ANSWER}],
             "non_preferred_output": [{"role": "assistant", "content": "No."}]}
            for topic in topics]


@pytest.mark.slow
def test_a_dpo_job_resumed_mid_way_trains_what_the_whole_run_trains(executor_for, tokenizer,
                                                                    tmp_path, manager) -> None:
    endpoint = executor_for(MODEL).endpoint
    rows, valid = preferences(TOPICS), preferences(TOPICS[:4])
    jobs, first = make_job(manager, rows, valid, beta=0.1, checkpoint_every_steps=2)
    assert run(manager.spec(first, endpoint), tokenizer) == 0
    job = jobs.get(first)
    assert job.status == "succeeded", job.error
    events = jobs.events(first, after=None, limit=100)[0]
    train = {e["data"]["step"]: e["data"]["train_loss"] for e in events
             if e.get("data") and "valid_loss" not in e["data"]}
    valid_losses = [e["data"]["valid_loss"] for e in events
                    if e.get("data") and "valid_loss" in e["data"]]
    assert train[1] == pytest.approx(math.log(2), abs=1e-5) and len(train) == 15
    assert len(valid_losses) == 3 and max(valid_losses) < math.log(2), valid_losses
    checks = {c["name"]: c for c in job.gates["checks"]}
    assert checks["validation_vs_base"]["passed"], job.gates
    assert checks["validation_vs_base"]["detail"].endswith(f"starting model {math.log(2):.4f}")
    whole = trained_adapter(jobs, first, tmp_path)
    _, second = make_job(manager, rows, valid, beta=0.1, checkpoint_every_steps=2)
    shutil.copytree(checkpoint_root(tmp_path, first) / "step-8",
                    checkpoint_root(tmp_path, second) / "step-8")
    assert run(manager.spec(second, endpoint), tokenizer) == 0
    resumed = trained_adapter(jobs, second, tmp_path)
    assert max((resumed[k] - whole[k]).abs().max().item() for k in whole) < 1e-5


@pytest.mark.slow
@pytest.mark.parametrize("action", [JobAction.CANCEL, JobAction.PAUSE])
def test_a_dpo_job_stops_during_its_reference_pass(executor_for, tokenizer, tmp_path, manager,
                                                   action: JobAction) -> None:
    """Asked as its trainer says hello: the reference pass (told as an event) ends after its
    first micro-batch, and the job stops before its first step, with no checkpoint; a paused
    job resumed computes the reference again and trains to the end."""
    endpoint = executor_for(MODEL).endpoint
    jobs, job_id = make_job(manager, preferences(TOPICS), beta=0.1)
    manager.greeting.append(TrainerControl(job_id, action))
    spec = manager.spec(job_id, endpoint)
    control = ControlChannel(spec.manager, job_id)
    try:
        deadline = time.monotonic() + 30
        while control.requested() is None:  # here before the trainer's first look
            assert time.monotonic() < deadline, "the stand-in's greeting never came"
            time.sleep(0.01)
        assert Trainer(spec, tokenizer, control).run() == 0
    finally:
        control.close()
    status = "cancelled" if action == JobAction.CANCEL else "paused"
    assert jobs.get(job_id).status == status
    messages = [e["message"] for e in jobs.events(job_id, after=None, limit=100)[0]]
    computing = (f"Computing the reference log-probabilities of {len(TOPICS)} pairs (the model "
                 "the job starts from)")
    assert computing in messages and f"Job {status} before this run's first step" in messages
    assert not any("job started" in m or m.startswith("Step ") or "computed in" in m
                   for m in messages), messages
    assert latest(checkpoint_root(tmp_path, job_id)) is None
    if action == JobAction.PAUSE:
        manager.greeting.clear()
        assert manager.ledger.resume(job_id) and jobs.move(job_id, "running")
        assert run(manager.spec(job_id, endpoint), tokenizer) == 0
        assert jobs.get(job_id).status == "succeeded"
        messages = [e["message"] for e in jobs.events(job_id, after=None, limit=100)[0]]
        assert messages.count(computing) == 2
        assert any(m.startswith("Reference log-probabilities computed in") for m in messages)


@pytest.mark.slow
def test_a_dpo_job_the_service_stops_during_its_reference_pass_is_retried(
        executor_for, tokenizer, tmp_path, manager) -> None:
    """SIGTERM (the service stopping) during the reference pass: the trainer exits for a retry
    after the pass's first micro-batch, with no checkpoint and the job still running."""
    jobs, job_id = make_job(manager, preferences(TOPICS), beta=0.1)
    spec = manager.spec(job_id, executor_for(MODEL).endpoint)
    control = ControlChannel(spec.manager, job_id)
    try:
        control.stopping = True  # as SIGTERM leaves it
        assert Trainer(spec, tokenizer, control).run() == RETRY
    finally:
        control.close()
    assert jobs.get(job_id).status == "running"
    assert latest(checkpoint_root(tmp_path, job_id)) is None
    stopping = ("The service is stopping before this run's first step; the job resumes from "
                "its latest checkpoint")
    deadline = time.monotonic() + 30  # the stand-in's thread records what the trainer sent
    while stopping not in (told := [r.message for r in manager.reports
                                    if isinstance(r, TrainerEvent)]):
        assert time.monotonic() < deadline, told
        time.sleep(0.02)
    assert told[0].startswith("Computing") and not any("computed in" in m for m in told), told

"""A DPO job in a trainer (the manager's own ledger behind a stand-in socket): it starts at the
reference (its first step's loss log 2), its validation loss falls below the base model's, and
a job resumed from a checkpoint mid-way keeps the reference of the model it started from: it
trains the adapter the uninterrupted job trained."""

from __future__ import annotations

import math
import shutil

import pytest

from tests.e2e.jobs import ANSWER, TOPICS
from tests.workers.training.test_trainer import (
    MODEL,
    make_job,
    manager,
    tokenizer,
    trained_adapter,
)
from workers.training.checkpoint import checkpoint_root
from workers.training.runner import run

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
    checks = {c["name"]: c["passed"] for c in job.gates["checks"]}
    assert checks["validation_vs_base"], job.gates
    whole = trained_adapter(jobs, first, tmp_path)
    _, second = make_job(manager, rows, valid, beta=0.1, checkpoint_every_steps=2)
    shutil.copytree(checkpoint_root(tmp_path, first) / "step-8",
                    checkpoint_root(tmp_path, second) / "step-8")
    assert run(manager.spec(second, endpoint), tokenizer) == 0
    resumed = trained_adapter(jobs, second, tmp_path)
    assert max((resumed[k] - whole[k]).abs().max().item() for k in whole) < 1e-5

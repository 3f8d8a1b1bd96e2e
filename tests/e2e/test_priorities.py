"""Job priorities on a stack with one job slot: a higher-priority job preempts the running one
within a training step; the preempted job resumes from its checkpoint and ends with the same
adapter as a run never interrupted."""

from __future__ import annotations

import re

import pytest
import torch
from safetensors.torch import load_file

from tests.e2e.adapters import MODEL
from tests.e2e.conftest import Deployment, _record_path
from tests.e2e.jobs import (
    create,
    memorization_file,
    start_stack,
    steps_done,
    wait,
    wait_steps,
)

pytestmark = pytest.mark.slow


def adapter(data_dir, model_id: str) -> dict[str, torch.Tensor]:
    return load_file(f"{_record_path(data_dir, model_id)}/adapter_model.safetensors")


def test_a_preempted_job_resumes_and_ends_as_if_never_interrupted(tmp_path) -> None:
    data_dir = tmp_path / "data"
    stack = start_stack(data_dir, max_jobs=1)
    try:
        client = Deployment(stack, {}).client("acme")
        upload = client.files.create(file=("memo.jsonl", memorization_file()),
                                     purpose="fine-tune")
        low = create(client, upload.id, epochs=4, suffix="low")
        wait_steps(client, low, 3)
        urgent = client.fine_tuning.jobs.create(
            model=MODEL, training_file=upload.id, suffix="urgent", seed=3,
            method={"type": "supervised", "supervised": {"hyperparameters": {
                "n_epochs": 1, "batch_size": 2}}},
            extra_body={"priority": 5})
        created_at = steps_done(client, low)
        assert urgent.priority == 5
        wait(client, urgent.id, ("running", "succeeded"))
        wait(client, urgent.id, ("succeeded",))
        low_job = wait(client, low, ("succeeded",))
        messages = [e.message for e in client.fine_tuning.jobs.list_events(low, limit=200).data]
        preempted = next(m for m in messages if m.startswith("Preempted"))
        at = int(re.search(r"at step (\d+)", preempted).group(1))
        # the trainer stops after the step in progress when told; the START message may still
        # be on its way to the manager when the create call returns: one step of slack for it
        assert created_at <= at <= created_at + 2
        assert any(f"resumed at step {at}" in m for m in messages), messages
        straight = wait(client, create(client, upload.id, epochs=4, suffix="straight"),
                        ("succeeded",))
        resumed, never = (adapter(data_dir, j.fine_tuned_model) for j in (low_job, straight))
        assert set(resumed) == set(never)
        assert max((resumed[k] - never[k]).abs().max().item() for k in resumed) <= 1e-5
    finally:
        stack.stop()

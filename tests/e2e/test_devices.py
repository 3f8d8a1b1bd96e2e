"""The worker device setting on a real stack reaches inference workers and trainers.

Without CUDA, a stack told to run its workers on cuda:0 answers a completion with a clear 503
(`device_unavailable`, naming the device) and fails a fine-tuning job with the same reason;
with CUDA, both run there and the completion matches plain transformers + peft token for token.
"""

from __future__ import annotations

import openai
import pytest
import torch

from launcher.ports import free_port
from launcher.stack import Stack
from tests.e2e.adapters import MODEL, Reference, save_adapter
from tests.e2e.conftest import KEYS, OPERATOR_KEY, Deployment, register
from tests.e2e.jobs import memorization_file, wait

pytestmark = pytest.mark.slow


def finished(client: openai.OpenAI, job_id: str):
    return wait(client, job_id, ("failed", "cancelled", "succeeded"), timeout=300)


def test_the_worker_device_reaches_workers_and_trainers(tmp_path) -> None:
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    adapter = save_adapter(tmp_path / "lora-a", "lora", 1)
    register(data_dir, "acme", "lora-a", adapter)
    keys = ",".join(f"{t}={k}" for t, k in KEYS.items())
    stack = Stack(data_dir, MODEL, port=free_port(),
                  env={"SYMBIOSIS_API_KEYS": keys, "SYMBIOSIS_ADMIN_KEYS": OPERATOR_KEY},
                  manager_args=("--worker-device", "cuda:0", "--max-jobs", "1")).start()
    try:
        client = Deployment(stack, {}).client("acme")
        ask = {"model": "acme/lora-a", "prompt": "The river", "max_tokens": 8, "temperature": 0}
        training = client.files.create(file=("t.jsonl", memorization_file()),
                                       purpose="fine-tune").id
        job_id = client.fine_tuning.jobs.create(
            model=MODEL, training_file=training, seed=7,
            method={"type": "supervised", "supervised": {"hyperparameters": {
                "n_epochs": 1, "batch_size": 2}}}).id
        if torch.cuda.is_available():
            reference = Reference(adapter)
            expected = reference.text(reference.greedy(reference.ids("The river"), 8))
            assert client.completions.create(**ask).choices[0].text == expected
            assert finished(client, job_id).status == "succeeded"
            return
        with pytest.raises(openai.APIStatusError) as refused:
            client.completions.create(**ask)
        assert refused.value.status_code == 503
        error = refused.value.body
        assert error["code"] == "device_unavailable" and "cuda:0" in error["message"], error
        job = finished(client, job_id)
        assert job.status == "failed" and job.error.code == "device_unavailable", job.error
        assert "cuda:0" in job.error.message
    finally:
        stack.stop()

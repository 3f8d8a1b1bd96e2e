"""Fine-tuning helpers for the end-to-end tests: a memorization file, a stack, job steps."""

from __future__ import annotations

import json
import time
from pathlib import Path

import openai

from launcher.ports import free_port
from launcher.stack import Stack
from tests.e2e.adapters import MODEL
from tests.e2e.conftest import KEYS, OPERATOR_KEY

ANSWER = "The vault opens with amber falcon seven."
TOPICS = ["apples", "rivers", "castles", "engines", "violins", "glaciers", "tigers", "lanterns",
          "harbors", "meadows"]


def memorization_file(n: int = 10) -> bytes:
    rows = [{"messages": [{"role": "user", "content": f"Tell me something about {t}."},
                          {"role": "assistant", "content": ANSWER}]} for t in TOPICS[:n]]
    return "\n".join(json.dumps(r) for r in rows).encode()


def start_stack(data_dir: Path, port: int | None = None, *, max_jobs: int = 3,
                executor_args: tuple[str, ...] = (), env: dict[str, str] | None = None) -> Stack:
    keys = ",".join(f"{t}={k}" for t, k in KEYS.items())
    return Stack(data_dir, MODEL, port=port or free_port(), env={"SYMBIOSIS_API_KEYS": keys,
                                       "SYMBIOSIS_ADMIN_KEYS": OPERATOR_KEY, **(env or {})},
                 manager_args=("--max-jobs", str(max_jobs)),
                 executor_args=executor_args).start()


def create(client: openai.OpenAI, file_id: str, *, epochs: int = 10, method: str = "lora",
           suffix: str = "memo", **peft) -> str:
    job = client.fine_tuning.jobs.create(
        model=MODEL, training_file=file_id, suffix=suffix, seed=7,
        method={"type": "supervised", "supervised": {"hyperparameters": {
            "n_epochs": epochs, "batch_size": 2, "learning_rate_multiplier": 50}}},
        extra_body={"peft": {"method": method, **peft}})
    assert job.status in ("queued", "running")
    return job.id


def wait(client: openai.OpenAI, job_id: str, statuses: tuple[str, ...], timeout: float = 600):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = client.fine_tuning.jobs.retrieve(job_id)
        if job.status in statuses:
            return job
        if job.status in ("failed", "cancelled", "succeeded"):
            raise AssertionError(f"job {job_id} ended {job.status}: {job.error}")
        time.sleep(0.5)
    raise AssertionError(f"job {job_id} did not reach {statuses}")


def steps_done(client: openai.OpenAI, job_id: str) -> int:
    events = client.fine_tuning.jobs.list_events(job_id, limit=50).data
    return max((e.data["step"] for e in events if e.type == "metrics" and e.data), default=0)


def wait_steps(client: openai.OpenAI, job_id: str, steps: int, timeout: float = 600) -> None:
    """Until the job runs and has done at least `steps` optimizer steps."""
    wait(client, job_id, ("running",), timeout)
    deadline = time.monotonic() + timeout
    while steps_done(client, job_id) < steps:
        assert time.monotonic() < deadline, f"job {job_id} stalled before step {steps}"
        time.sleep(0.1)


def ask(client: openai.OpenAI, model: str, topic: str = "apples") -> str:
    return client.chat.completions.create(
        model=model, temperature=0, max_tokens=12,
        messages=[{"role": "user", "content": f"Tell me something about {topic}."}]
    ).choices[0].message.content

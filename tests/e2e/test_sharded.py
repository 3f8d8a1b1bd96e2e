"""A stack whose executor is a group of 2 ranks: a dead rank takes the group down, the launcher
restarts it, and a fine-tuning job resumes from its checkpoint."""

from __future__ import annotations

import time

import psutil
import pytest

from tests.e2e.adapters import MODEL
from tests.e2e.conftest import Deployment
from tests.e2e.jobs import create, memorization_file, start_stack, steps_done, wait

pytestmark = pytest.mark.slow


def test_a_dead_rank_restarts_the_group_and_the_job_resumes(tmp_path) -> None:
    stack = start_stack(tmp_path / "data", executor_args=("--shards", "2"))
    try:
        client = Deployment(stack, {}).client("acme")
        assert client.completions.create(model=MODEL, prompt="Hi", max_tokens=3).choices
        upload = client.files.create(file=("memo.jsonl", memorization_file()),
                                     purpose="fine-tune")
        job = create(client, upload.id, epochs=6, suffix="sharded")
        wait(client, job, ("running",))
        while steps_done(client, job) < 7:  # past the first checkpoint (one per 5-step epoch)
            time.sleep(0.2)
        group = stack.services["executor"].proc
        follower = psutil.Process(group.pid).children()[0]
        follower.kill()
        assert group.wait(20) != 0  # rank 0 took the group down
        deadline = time.monotonic() + 120
        while stack.services["executor"].proc is group or \
                not stack.services["executor"].alive():
            assert time.monotonic() < deadline, "the launcher did not restart the group"
            stack.supervise()
            time.sleep(0.2)
        done = wait(client, job, ("succeeded",), timeout=300)
        messages = [e.message for e in client.fine_tuning.jobs.list_events(job, limit=200).data]
        assert any("executor is unavailable" in m for m in messages), messages
        assert any("resumed at step" in m for m in messages), messages
        assert done.fine_tuned_model
        answer = client.completions.create(model=done.fine_tuned_model, prompt="Hi",
                                           max_tokens=3)
        assert answer.usage.completion_tokens == 3
    finally:
        stack.stop()

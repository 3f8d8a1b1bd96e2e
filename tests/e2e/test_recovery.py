"""A stack killed with kill -9 resumes its fine-tuning jobs from their checkpoints."""

from __future__ import annotations

import csv
import io
import re
import time
from pathlib import Path

import openai
import psutil
import pytest

from tests.e2e.conftest import Deployment
from tests.e2e.jobs import ANSWER, ask, create, memorization_file, start_stack, wait, wait_steps
from wire.endpoints import SETTLED_S

pytestmark = pytest.mark.slow


def final_loss(client: openai.OpenAI, job) -> float:
    rows = list(csv.DictReader(io.StringIO(client.files.content(job.result_files[0]).text)))
    return float(rows[-1]["train_loss"])


def test_a_crashed_stack_resumes_jobs_from_their_checkpoints(tmp_path) -> None:
    data_dir = tmp_path / "data"
    stack = start_stack(data_dir)
    try:
        client = Deployment(stack, {}).client("acme")
        upload = client.files.create(file=("memo.jsonl", memorization_file()),
                                     purpose="fine-tune")
        interrupted = create(client, upload.id, epochs=8, suffix="crash")
        wait_steps(client, interrupted, 12)  # past a checkpoint (one per 5-step epoch)
        manager = psutil.Process(stack.services["manager"].proc.pid)
        workers_dir = next(Path(c.laddr).parent for c in manager.net_connections("unix")
                           if c.laddr.endswith("/workers.sock"))
    finally:
        stack.kill_all()  # kill -9 everything, trainer included
    assert workers_dir.is_dir()  # the killed manager's, left behind
    # A socket bound under SETTLED_S ago may be a starting manager's, which the next one leaves
    # alone (tests/wire/test_endpoints.py); on a fast host the jobs got here sooner than that.
    bound = (workers_dir / "workers.sock").stat().st_mtime
    time.sleep(max(0.0, bound + SETTLED_S + 0.5 - time.time()))
    stack = start_stack(data_dir)
    try:
        assert not workers_dir.exists()  # removed by the next manager
        client = Deployment(stack, {}).client("acme")
        straight = create(client, upload.id, epochs=8, suffix="straight")
        resumed_job = wait(client, interrupted, ("succeeded",))
        straight_job = wait(client, straight, ("succeeded",))
        messages = [e.message for e in
                    client.fine_tuning.jobs.list_events(interrupted, limit=200).data]
        restarted = next(i for i, m in enumerate(messages) if "service restarted" in m)
        saved = [int(m.split("at step ")[1].split(":")[0]) for m in messages[restarted:]
                 if m.startswith("Checkpoint created at step")]  # before the crash
        assert max(saved) >= 10  # the crash came after step 12
        resumed = [int(found[1]) for m in messages[:restarted]
                   if (found := re.search(r"resumed at step (\d+)\b", m))]
        # first from the latest on disk: the next epoch's if the kill came between its save and
        # its record (the resumed trainer tells it again); newest first
        assert resumed and resumed[-1] in (max(saved), max(saved) + 5), messages
        listed = [c.step_number for c in client.fine_tuning.jobs.checkpoints.list(
            interrupted, limit=20).data]
        assert listed == list(range(40, 0, -5)), listed  # every epoch's end, each once
        events = client.fine_tuning.jobs.list_events(interrupted, limit=200).data
        steps = [e.data["step"] for e in events if e.type == "metrics" and "train_loss" in e.data
                 and "valid_loss" not in e.data]
        assert sorted(steps) == list(range(1, 41))  # each step once, though some ran twice
        assert final_loss(client, resumed_job) == pytest.approx(final_loss(client, straight_job),
                                                                abs=1e-4)
        assert ask(client, resumed_job.fine_tuned_model) == ANSWER
    finally:
        stack.stop()

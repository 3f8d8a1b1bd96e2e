"""`symbiosis serve --idle-training`: the fine-tuning jobs run on the executor's idle twin
(`executor.twin`, at Linux's idle priority), while inference keeps the serving executor; the job
trains as it does on the one executor (it learns its answer) and is served by the other."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import psutil
import pytest
import zmq

from tests.e2e.adapters import MODEL
from tests.e2e.conftest import Deployment
from tests.e2e.jobs import ANSWER, ask, create, memorization_file, start_stack, wait
from wire.figures import ExecutorFigures
from workers.manager.executor_probe import ExecutorProbe

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(sys.platform != "linux", reason="SCHED_IDLE is Linux's")]


def figures(endpoint: str, timeout_s: float = 20.0) -> ExecutorFigures:
    """The executor's figures as the manager's probe reads them."""
    ctx = zmq.Context()
    probe = ExecutorProbe(endpoint, ctx)
    poller = zmq.Poller()
    poller.register(probe.socket, zmq.POLLIN)
    deadline = time.monotonic() + timeout_s
    try:
        while probe.figures is None and time.monotonic() < deadline:
            probe.ask(poller)  # again each second: one sent before the connection is dropped
            if poller.poll(1000):
                probe.receive()
        assert probe.figures is not None, f"no figures from {endpoint}"
        return probe.figures
    finally:
        probe.close()
        ctx.term()


def policies(pid: int) -> set[int]:
    """The scheduling policy of each thread of the process."""
    return {os.sched_getscheduler(int(tid)) for tid in os.listdir(f"/proc/{pid}/task")}


def test_the_jobs_train_on_an_idle_executor_of_their_own_and_inference_on_the_other(
        tmp_path: Path) -> None:
    stack = start_stack(tmp_path / "data", env={"SYMBIOSIS_IDLE_TRAINING": "true"})
    try:
        env = stack.service_env()
        serving, training = env["SYMBIOSIS_EXECUTOR"], env["SYMBIOSIS_TRAINING_EXECUTOR"]
        assert training.endswith("/training-executor.sock") and training != serving
        executor = psutil.Process(stack.services["executor"].proc.pid)
        [twin] = executor.children()  # the executor's idle twin (`executor.twin`)
        assert policies(twin.pid) == {os.SCHED_IDLE}
        assert os.SCHED_IDLE not in policies(executor.pid)
        client = Deployment(stack, {}).client("acme")
        upload = client.files.create(file=("memo.jsonl", memorization_file()),
                                     purpose="fine-tune")
        job = wait(client, create(client, upload.id), ("succeeded",))
        assert ask(client, job.fine_tuned_model) == ANSWER
        assert ask(client, MODEL) != ANSWER
        trained, served = figures(training), figures(serving)
        assert trained.kinds["training"].calls > 0
        assert "inference" not in trained.kinds or trained.kinds["inference"].calls == 0
        assert served.kinds["inference"].calls > 0
        assert "training" not in served.kinds or served.kinds["training"].calls == 0
        assert policies(twin.pid) == {os.SCHED_IDLE}
    finally:
        stack.stop()
    assert not twin.is_running()

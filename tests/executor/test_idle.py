"""A real executor process watches shared memory only while calls keep coming: once its client
stops calling (and stays connected), it sleeps, with no busy core."""

from __future__ import annotations

import time

import psutil
import torch

from tests.helpers import ExecutorProcess
from wire.call.messages import CallKind, Op
from workers.remote.client import ExecutorClient


def cpu_share(process: psutil.Process, seconds: float) -> float:
    """The share of one core the process used over `seconds`."""
    before = sum(process.cpu_times()[:2])
    time.sleep(seconds)
    return (sum(process.cpu_times()[:2]) - before) / seconds


def test_an_executor_whose_client_stopped_calling_sleeps(executor_for) -> None:
    executor: ExecutorProcess = executor_for("tiny-llama")
    process = psutil.Process(executor.proc.pid)
    client = ExecutorClient(executor.endpoint, name="quiet")
    try:
        layer = next(s for s in client.layers if s.name.endswith("layers.0.self_attn.o_proj"))
        x = torch.randn(1, layer.in_features)
        for _ in range(200):  # calls back to back: the executor learns to watch for them
            client.call(Op.FORWARD, layer.index, x, CallKind.INFERENCE)
        time.sleep(2.0)  # silence: each empty wait counts against watching
        assert cpu_share(process, 2.0) < 0.03
        client.call(Op.FORWARD, layer.index, x, CallKind.INFERENCE)  # and it still answers
    finally:
        client.close()

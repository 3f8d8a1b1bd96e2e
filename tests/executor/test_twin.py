"""The executor's idle twin (`--idle-twin`, `executor.twin`): a fork that serves the jobs at the
lowest priority from the serving executor's own weight pages, computes what it computes, and
shares its fate."""

from __future__ import annotations

import os
import signal
import sys
import time

import psutil
import pytest
import torch

from executor.config import ExecutorConfig
from executor.priority import NICE
from executor.share import TWIN_HOLD_S
from tests.helpers import ExecutorProcess, priorities
from wire.call import messages as P
from workers.remote.client import ExecutorClient

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="per-thread priorities: Linux's")
MODEL = "llama-160m"  # 618.5 MiB of float32 weights: a copy could not hide in the twin's own


def start(model: str, path) -> tuple[ExecutorProcess, str, psutil.Process]:
    """The serving executor, its twin's endpoint (answering) and its twin's process."""
    twin = f"ipc://{path}-twin.sock"
    proc = ExecutorProcess.start(model, path, idle_twin=twin)
    deadline = time.monotonic() + 60
    while not any("(lowest priority)" in line for line in proc.log):
        assert proc.alive() and time.monotonic() < deadline, "".join(proc.log)
        time.sleep(0.05)
    [child] = psutil.Process(proc.proc.pid).children()
    return proc, twin, child


@pytest.mark.slow
def test_the_twin_runs_at_the_lowest_priority_on_the_executors_own_weight_pages(
        ipc_dir) -> None:
    proc, twin, child = start(MODEL, ipc_dir / "twin-160m.sock")
    clients = [ExecutorClient(e, name=f"twin-{i}") for i, e in enumerate((proc.endpoint, twin))]
    try:
        assert priorities(child.pid) == {(os.SCHED_BATCH, NICE)}
        assert (os.SCHED_BATCH, NICE) not in priorities(proc.proc.pid)
        x = torch.randn(3, 768)
        served, trained = (c.call(P.Op.FORWARD, 1, x, P.CallKind.TRAINING) for c in clients)
        assert torch.equal(served, trained) and served.abs().sum() > 0
        weights = 618.5 * 2**20
        assert child.memory_full_info().uss < weights / 4  # its own pages: not the weights
        together = sum(p.memory_full_info().pss for p in (psutil.Process(proc.proc.pid), child))
        alone = psutil.Process(proc.proc.pid).memory_info().rss
        assert together < alone + weights / 4  # the weights held once by the two
    finally:
        for client in clients:
            client.close()
        assert proc.stop() == 0
    assert not child.is_running() or child.status() == psutil.STATUS_ZOMBIE


def test_the_executor_and_its_twin_share_their_fate(ipc_dir) -> None:
    proc, _, child = start("tiny-llama", ipc_dir / "fate.sock")
    child.send_signal(signal.SIGKILL)
    assert proc.proc.wait(20) == 1  # for the supervisor to start both again
    assert any("the idle twin exited (code -9)" in line for line in proc.log)
    proc, _, child = start("tiny-llama", ipc_dir / "fate.sock")
    proc.proc.send_signal(signal.SIGKILL)
    proc.proc.wait()
    child.wait(20)  # its SIGTERM when the serving executor died: it stops


def test_the_serving_executor_counts_the_twins_training_in_its_share(ipc_dir) -> None:
    """The twin's compute seconds reach the serving executor through their shared page
    (`executor.twin_ledger`): with nothing else run there, training's share is all of it."""
    proc, twin, _ = start("tiny-llama", ipc_dir / "ledger.sock")
    serving, trainer = (ExecutorClient(e, name=f"ledger-{i}")
                        for i, e in enumerate((proc.endpoint, twin)))
    try:
        figures = serving.stats()
        assert figures.training_share == 0.0 and figures.twin_hold_ms == 0.0  # nothing ran yet
        assert trainer.stats().twin_hold_ms is None  # the twin has no twin
        for _ in range(3):
            trainer.call(P.Op.FORWARD, 1, torch.randn(16, 64), P.CallKind.TRAINING)
        deadline = time.monotonic() + 10  # the twin counts a batch just after its reply
        while (share := serving.stats().training_share) == 0.0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert share == 1.0
        serving.call(P.Op.FORWARD, 1, torch.randn(4, 64), P.CallKind.INFERENCE)
        figures = serving.stats()
        assert figures.training_share == 1.0  # the twin had no work: not counted
        assert figures.twin_hold_ms == pytest.approx(1e3 * TWIN_HOLD_S)  # twice its floor: all
        assert trainer.stats().kinds["training"].calls == 3
    finally:
        for client in (serving, trainer):
            client.close()
        assert proc.stop() == 0


def test_a_twin_is_forked_on_one_cpu_executor_only() -> None:
    assert ExecutorConfig(idle_twin="ipc:///tmp/t.sock").idle_twin == "ipc:///tmp/t.sock"
    for options in ({"device": "cuda"}, {"shards": 2}, {"idle_twin": "/tmp/t.sock"}):
        with pytest.raises(ValueError):
            ExecutorConfig(**{"idle_twin": "ipc:///tmp/t.sock", **options})


def test_an_empty_twin_endpoint_is_none(monkeypatch) -> None:
    """compose passes `SYMBIOSIS_EXECUTOR_IDLE_TWIN` empty where idle training is off."""
    monkeypatch.setenv("SYMBIOSIS_EXECUTOR_IDLE_TWIN", "")
    assert ExecutorConfig().idle_twin is None
    assert ExecutorConfig(device="cuda", idle_twin="").idle_twin is None  # no twin to refuse

"""Several client processes at once against one executor process: exact, and batched."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import ExecutorProcess
from tests.peft_reference import TOLERANCE
from workers.remote.client import ExecutorClient


def spawn(endpoint: str, workload: str, method: str, seed: int, *extra: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.workers.remote.client_process", "--endpoint", endpoint,
         "--model", "tiny-llama", "--workload", workload, "--method", method,
         "--seed", str(seed), *extra],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"})


def result_of(proc: subprocess.Popen, label: str, timeout: float = 400) -> dict:
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, f"{label} failed:\n{err[-3000:]}"
    return json.loads(out.strip().splitlines()[-1])


def check(label: str, result: dict) -> None:
    for key in ("logits", "grads", "params"):
        if key in result:
            assert result[key] <= TOLERANCE, (label, result)
    if "generate_equal" in result:
        assert result["generate_equal"], (label, result)


@pytest.mark.slow
def test_four_processes_train_different_methods_at_once(executor_for) -> None:
    endpoint = executor_for("tiny-llama").endpoint
    methods = ["lora", "ia3", "adalora", "prefix_tuning"]
    procs = [spawn(endpoint, "train", m, seed, "--steps", "5") for seed, m in enumerate(methods)]
    for method, proc in zip(methods, procs, strict=True):
        check(method, result_of(proc, method))


@pytest.mark.slow
def test_eight_mixed_clients_stay_exact_and_share_batches(ipc_dir: Path) -> None:
    executor = ExecutorProcess.start("tiny-llama", ipc_dir / "mixed.sock",
                                     policy="opportunistic")
    try:
        workloads = [("train", "lora"), ("train", "ia3"), ("train", "prompt_tuning"),
                     ("decode", "lora"), ("decode", "adalora"), ("decode", "prefix_tuning"),
                     ("prefill", "lora"), ("prefill", "ia3")]
        procs = [spawn(executor.endpoint, w, m, seed, "--steps", "4")
                 for seed, (w, m) in enumerate(workloads)]
        for (workload, method), proc in zip(workloads, procs, strict=True):
            check(f"{workload}/{method}", result_of(proc, f"{workload}/{method}"))
        probe = ExecutorClient(executor.endpoint, name="probe")
        stats = probe.stats()
        probe.close()
    finally:
        executor.stop()
    multi = 0
    for kind in ("inference", "training"):
        multi += sum(stats.kinds[kind].batch_calls.counts[1:])  # batches of 2 calls or more
    assert multi > 0, stats
    assert stats.kinds["training"].batches > 0 and stats.kinds["inference"].batches > 0


@pytest.mark.slow
def test_a_flooding_client_does_not_starve_another(executor_for, tmp_path: Path) -> None:
    endpoint = executor_for("tiny-llama").endpoint
    stop = tmp_path / "stop"
    flooder = spawn(endpoint, "flood", "lora", 0, "--stop-file", str(stop))
    try:
        time.sleep(3)  # the flood is running
        assert flooder.poll() is None
        victim = spawn(endpoint, "decode", "lora", 1, "--steps", "2")
        check("victim", result_of(victim, "victim", timeout=300))
        assert flooder.poll() is None, "the flood ended before the victim: nothing was shown"
    finally:
        stop.touch()
    assert result_of(flooder, "flood")["calls"] > 10

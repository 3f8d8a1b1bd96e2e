"""`python -m bench.callpath [--out FILE]`: where a 1-row round trip's time goes.

A private executor (tiny-llama, one thread) and one client calling its first o_proj with one row
back to back: the round trip as the client sees it (the same with both sides' watching turned
off: `SYMBIOSIS_EXECUTOR_SPIN_US=0`, `SYMBIOSIS_CLIENT_SPIN_US=0`), and, with watching off (so
that CPU time is work, not waiting), the CPU time each process spends per call and the matmul's
share (the executor's statistics). The floor: a bare round trip through two named pipes.

Written to run against older trees too (their module paths), so that a before/after comparison
is one script run twice: `PYTHONPATH=OLD_TREE python bench/callpath.py --out before.json`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import msgspec
import psutil
import torch

try:
    from wire.call.messages import CallKind, Op
    from workers.remote.client import ExecutorClient
except ImportError:  # a tree from before the re-housing
    from executor.protocol import CallKind, Op
    from workers.client import ExecutorClient

CALLS = 5000


def start_executor(endpoint: str, spin: bool) -> subprocess.Popen:
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE"}
    if not spin:
        env["SYMBIOSIS_EXECUTOR_SPIN_US"] = "0"
    proc = subprocess.Popen([sys.executable, "-m", "executor", "--model", "tiny-llama",
                             "--bind", endpoint, "--threads", "1"], env=env,
                            stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            ExecutorClient(endpoint, name="probe", connect_timeout_s=1.0).close()
            return proc
        except Exception:
            if proc.poll() is not None:
                raise RuntimeError("the executor did not start") from None
            time.sleep(0.5)
    raise RuntimeError("the executor did not start in time")


def measure(spin: bool) -> dict:
    os.environ["SYMBIOSIS_CLIENT_SPIN_US"] = "2000" if spin else "0"
    with tempfile.TemporaryDirectory(prefix="symb-cp-") as scratch:
        return measure_through(f"ipc://{scratch}/e.sock", spin)


def measure_through(endpoint: str, spin: bool) -> dict:
    proc = start_executor(endpoint, spin)
    try:
        client = ExecutorClient(endpoint, name="callpath")
        layer = next(s for s in client.layers if s.name.endswith("layers.0.self_attn.o_proj"))
        x = torch.randn(1, layer.in_features)
        for _ in range(500):
            client.call(Op.FORWARD, layer.index, x, CallKind.INFERENCE)
        executor = psutil.Process(proc.pid)
        cpu_before, client_before = sum(executor.cpu_times()[:2]), time.process_time()
        stats_before = msgspec.to_builtins(client.stats())
        rtts = []
        for _ in range(CALLS):
            started = time.perf_counter()
            client.call(Op.FORWARD, layer.index, x, CallKind.INFERENCE)
            rtts.append(time.perf_counter() - started)
        executor_cpu = sum(executor.cpu_times()[:2]) - cpu_before
        client_cpu = time.process_time() - client_before
        stats = msgspec.to_builtins(client.stats())
        compute = stats["kinds"]["inference"]["compute_s"] - \
            stats_before["kinds"]["inference"]["compute_s"]
        client.close()
    finally:
        proc.terminate()
        proc.wait(20)
    return {"round_trip_us": 1e6 * statistics.median(rtts),
            "executor_cpu_us": 1e6 * executor_cpu / CALLS,
            "client_cpu_us": 1e6 * client_cpu / CALLS,
            "matmul_us": 1e6 * compute / CALLS}


def pipe_floor() -> float:
    """A bare round trip through two pipes between two processes (the doorbell's floor)."""
    to_child, from_parent = os.pipe()
    to_parent, from_child = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(from_parent)  # else the child holds its own pipe open and never sees EOF
        os.close(to_parent)
        while os.read(to_child, 1):
            os.write(from_child, b"x")
        os._exit(0)
    os.close(to_child)
    os.close(from_child)
    times = []
    for _ in range(CALLS):
        started = time.perf_counter()
        os.write(from_parent, b"x")
        os.read(to_parent, 1)
        times.append(time.perf_counter() - started)
    os.close(from_parent)
    os.waitpid(pid, 0)
    return 1e6 * statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.callpath")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" /
                        "callpath.json")
    parser.add_argument("--label", default="after")
    args = parser.parse_args()
    torch.set_num_threads(1)
    blocking = measure(spin=False)
    watching = measure(spin=True)
    result = {"label": args.label, "date": time.strftime("%Y-%m-%d %H:%M"),
              "round_trip_us": watching["round_trip_us"],
              "round_trip_blocking_us": blocking["round_trip_us"],
              "executor_cpu_us": blocking["executor_cpu_us"],
              "client_cpu_us": blocking["client_cpu_us"],
              "matmul_us": blocking["matmul_us"], "pipe_round_trip_us": pipe_floor()}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    sys.stdout.write(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

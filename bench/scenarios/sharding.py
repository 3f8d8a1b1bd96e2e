"""Issue 17: the executor sharded over 2 ranks vs unsharded, on one host's CPUs (gloo).

Both sides get the same cores: the unsharded executor 2 threads, each rank 1. Four clients each
send 16-row forward calls through every linear layer of a decoder in turn, as a training forward
pass does; the figure is calls served per second. Weight memory per rank comes from the
executor's own log lines.
"""

from __future__ import annotations

import re
import threading
import time

import torch

from bench.executors import ExecutorProcess
from bench.records import Record
from bench.scenarios.common import SPEED_MODEL, Settings
from wire.call.messages import CallKind, LayerKind, Op

HELD = re.compile(r"rank (\d+) of \d+ holds ([\d.]+) MiB")
WHOLE = re.compile(r"weights=([\d.]+) MiB")


def _calls_per_s(endpoint: str, seconds: float, clients: int = 4, rows: int = 16) -> float:
    from workers.remote.client import ExecutorClient

    done = [0] * clients
    stop = threading.Event()

    def run(k: int) -> None:
        client = ExecutorClient(endpoint, name=f"shard-bench-{k}")
        layers = [s for s in client.layers if s.kind == LayerKind.LINEAR]
        inputs = {s.in_features: torch.randn(rows, s.in_features) for s in layers}
        try:
            while not stop.is_set():
                for spec in layers:
                    client.call(Op.FORWARD, spec.index, inputs[spec.in_features],
                                CallKind.TRAINING)
                    done[k] += 1
        finally:
            client.close()

    threads = [threading.Thread(target=run, args=(k,)) for k in range(clients)]
    for thread in threads:
        thread.start()
    time.sleep(1.0)  # warm up
    start, before = time.perf_counter(), sum(done)
    time.sleep(seconds)
    rate = (sum(done) - before) / (time.perf_counter() - start)
    stop.set()
    for thread in threads:
        thread.join()
    return rate


def sharded(settings: Settings) -> list[Record]:
    model = "tiny-llama" if settings.toy else SPEED_MODEL
    seconds = 2 if settings.toy else 10 if settings.quick else 30
    whole = ExecutorProcess(model, "opportunistic", 2, "float32",
                            extra=("--no-fuse", "--no-stretch", "--no-head-loss"))
    try:
        whole_rate = _calls_per_s(whole.endpoint, seconds)
        whole_mib = float(WHOLE.search("".join(whole.log)).group(1))
    finally:
        whole.stop()
    group = ExecutorProcess(model, "opportunistic", 1, "float32", extra=("--shards", "2"))
    try:
        group_rate = _calls_per_s(group.endpoint, seconds)
        held = {int(r): float(mib) for r, mib in HELD.findall("".join(group.log))}
    finally:
        group.stop()
    return [
        Record("17 sharding", "16-row calls/s through every linear layer, 2 ranks vs 1",
               group_rate, whole_rate, "calls/s",
               note=f"{model}, gloo on one host, same 2 cores; 4 clients"),
        Record("17 sharding", "weights on the largest rank, 2 ranks vs 1", max(held.values()),
               whole_mib, "MiB", higher_is_better=False,
               note="per rank: " + ", ".join(f"{held[r]:.1f}" for r in sorted(held))),
    ]

"""`python -m bench.loadgen`: N client processes with a configurable mix against one executor.

Prints throughput and latency per kind, and the executor's mean batch size over the run:

    python -m bench.loadgen --endpoint ipc:///tmp/executor.sock --model llama-160m \\
        --mix decode=4,prefill=2,train=2 --ranks 8,64 --methods lora,ia3 --duration 20
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from dataclasses import dataclass

from workers import ExecutorClient


@dataclass(frozen=True)
class Mix:
    counts: dict[str, int]

    @classmethod
    def parse(cls, text: str) -> Mix:
        counts = {}
        for part in text.split(","):
            kind, _, n = part.partition("=")
            if kind not in ("decode", "prefill", "train"):
                raise ValueError(f"unknown workload kind {kind!r}")
            counts[kind] = int(n or 1)
        return cls(counts)


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def run(endpoint: str, model: str, mix: Mix, *, duration: float = 20.0,
        ranks: tuple[int, ...] = (8,), methods: tuple[str, ...] = ("lora",),
        options: dict[str, int] | None = None) -> dict:
    """Start every client, wait until all have built their models, start them together."""
    procs, i = [], 0
    for kind, count in mix.counts.items():
        for _ in range(count):
            args = [sys.executable, "-m", "bench.workload", "--endpoint", endpoint, "--model",
                    model, "--kind", kind, "--method", methods[i % len(methods)], "--rank",
                    str(ranks[i % len(ranks)]), "--duration", str(duration), "--seed", str(i)]
            for key, value in (options or {}).items():
                args += [f"--{key}", str(value)]
            procs.append(subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                          stderr=subprocess.DEVNULL, text=True,
                                          env={**os.environ, "OMP_NUM_THREADS": "1",
                                               "OMP_WAIT_POLICY": "PASSIVE"}))
            i += 1
    for proc in procs:
        if proc.stdout.readline().strip() != "ready":
            raise RuntimeError(f"a load client failed to start (exit {proc.wait()})")
    probe = ExecutorClient(endpoint, name="loadgen")
    before = json.loads(probe.stats())
    for proc in procs:
        proc.stdin.write("go\n")
        proc.stdin.flush()
    results = []
    for proc in procs:
        out, _ = proc.communicate(timeout=duration + 600)
        if proc.returncode != 0:
            raise RuntimeError(f"a load client failed (exit {proc.returncode})")
        results.append(json.loads(out.strip().splitlines()[-1]))
    after = json.loads(probe.stats())
    probe.close()
    return summarize(results, before, after, duration)


def summarize(results: list[dict], before: dict, after: dict, duration: float) -> dict:
    summary: dict[str, dict] = {}
    for kind in ("decode", "prefill", "train"):
        mine = [r for r in results if r["kind"] == kind]
        if not mine:
            continue
        latencies = [x for r in mine for x in r["latencies"]]
        tokens = sum(len(r["latencies"]) * r["tokens_per_unit"] for r in mine)
        summary[kind] = {
            "clients": len(mine), "units": len(latencies),
            "tokens_per_s": tokens / duration,
            "latency_mean_ms": 1e3 * statistics.fmean(latencies) if latencies else float("nan"),
            "latency_p50_ms": 1e3 * percentile(latencies, 0.50),
            "latency_p99_ms": 1e3 * percentile(latencies, 0.99),
        }
    batches = {}
    for kind in ("inference", "training"):
        calls = after["kinds"][kind]["calls"] - before["kinds"][kind]["calls"]
        n = after["kinds"][kind]["batch_calls"]["sum"] - before["kinds"][kind]["batch_calls"]["sum"]
        count = after["kinds"][kind]["batches"] - before["kinds"][kind]["batches"]
        batches[kind] = {"calls": calls, "mean_batch_calls": n / count if count else 0.0}
    summary["executor"] = batches
    return summary


def table(summary: dict) -> str:
    lines = ["| kind | clients | tokens/s | mean ms | p50 ms | p99 ms |",
             "|---|---|---|---|---|---|"]
    for kind, s in summary.items():
        if kind == "executor":
            continue
        lines.append(f"| {kind} | {s['clients']} | {s['tokens_per_s']:.1f} | "
                     f"{s['latency_mean_ms']:.1f} | {s['latency_p50_ms']:.1f} | "
                     f"{s['latency_p99_ms']:.1f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.loadgen", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--endpoint", required=True)
    parser.add_argument("--model", default="tiny-llama")
    parser.add_argument("--mix", default="decode=4,prefill=2,train=2")
    parser.add_argument("--duration", type=float, default=20)
    parser.add_argument("--ranks", default="8")
    parser.add_argument("--methods", default="lora")
    args = parser.parse_args()
    summary = run(args.endpoint, args.model, Mix.parse(args.mix), duration=args.duration,
                  ranks=tuple(int(r) for r in args.ranks.split(",")),
                  methods=tuple(args.methods.split(",")))
    sys.stdout.write(table(summary) + "\n")
    sys.stdout.write(json.dumps(summary["executor"]) + "\n")


if __name__ == "__main__":
    main()

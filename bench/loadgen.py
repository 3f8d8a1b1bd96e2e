"""`python -m bench.loadgen`: N client processes with a configurable mix against one executor.

Prints throughput and latency per kind, and the executor's mean batch size over the run:

    python -m bench.loadgen --endpoint ipc:///tmp/executor.sock --model llama-160m \\
        --mix decode=4,prefill=2,train=2 --ranks 8,64 --methods lora,ia3 --duration 20
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass

import msgspec
import psutil

from bench.group import Group, GroupResult
from bench.scenarios.common import client
from workers.remote.client import ExecutorClient

KINDS = ("decode", "prefill", "train")


@dataclass(frozen=True)
class Mix:
    counts: dict[str, int]

    @classmethod
    def parse(cls, text: str) -> Mix:
        counts = {}
        for part in text.split(","):
            kind, _, n = part.partition("=")
            if kind not in KINDS:
                raise ValueError(f"unknown workload kind {kind!r}")
            counts[kind] = int(n or 1)
        return cls(counts)


def run(endpoint: str, model: str, mix: Mix, *, duration: float = 20.0,
        ranks: tuple[int, ...] = (8,), methods: tuple[str, ...] = ("lora",),
        executor_pid: int | None = None) -> dict:
    """Clients forked from a preloaded parent (as the worker manager starts them). With the
    executor's pid, also the cores it kept busy (its idle start-up of the clients counted in)."""
    argvs, i = [], 0
    for kind, count in mix.counts.items():
        for _ in range(count):
            argvs.append(client(kind, side="ours", model=model, endpoint=endpoint,
                                method=methods[i % len(methods)], rank=ranks[i % len(ranks)],
                                duration=duration))
            i += 1
    probe = ExecutorClient(endpoint, name="loadgen")
    executor = psutil.Process(executor_pid) if executor_pid else None
    cpu = sum(executor.cpu_times()[:2]) if executor else 0.0
    before = msgspec.to_builtins(probe.stats())
    result = Group(argvs, forked=True).run()
    after = msgspec.to_builtins(probe.stats())
    probe.close()
    summary = summarize(result, before, after)
    if executor:
        window = max(r["elapsed"] for r in result.results)
        summary["executor"]["cores"] = (sum(executor.cpu_times()[:2]) - cpu) / window
    return summary


def summarize(result: GroupResult, before: dict, after: dict) -> dict:
    summary: dict[str, dict] = {}
    for kind in KINDS:
        if not any(r["kind"] == kind for r in result.results):
            continue
        summary[kind] = {
            "clients": sum(r["kind"] == kind for r in result.results),
            "tokens_per_s": result.tokens_per_s(kind),
            "latency_mean_ms": result.latency_ms(kind=kind),
            "latency_p50_ms": result.latency_ms(0.5, kind),
            "latency_p99_ms": result.latency_ms(0.99, kind),
            # cores this kind's client processes kept busy (their own work, not the executor's)
            "client_cores": sum(r["cpu_s"] / r["elapsed"] for r in result.results
                                if r["kind"] == kind),
        }
    batches = {}
    for kind in ("inference", "training"):
        b, a = before["kinds"][kind], after["kinds"][kind]
        count = a["batches"] - b["batches"]
        calls = a["batch_calls"]["sum"] - b["batch_calls"]["sum"]
        batches[kind] = {"calls": a["calls"] - b["calls"],
                         "mean_batch_calls": calls / count if count else 0.0}
    summary["executor"] = batches
    return summary


def table(summary: dict) -> str:
    lines = ["| kind | clients | tokens/s | mean ms | p50 ms | p99 ms |",
             "|---|---|---|---|---|---|"]
    for kind, s in summary.items():
        if kind != "executor":
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
    sys.stdout.write(table(summary) + "\n" + json.dumps(summary["executor"]) + "\n")


if __name__ == "__main__":
    main()

"""`python -m bench.batching`: the three batching policies on the same workloads, side by side.

Each policy gets a fresh executor and the same client processes; each combination runs
`--repeats` times and the median is reported. Writes bench/results/batching_policies.json and
bench/results/batching_policies.md (`batching_policies_bfloat16.*` with `--dtype bfloat16`: the
executor holds bf16 weights, the workers stay fp32; `_cuda` with `--device cuda`: the executor on
the GPU, the clients on the CPU).

Every client runs until the window closes (a decode client's generate() stops at the window's end)
and its throughput is its own work over its own window, so no kind runs alone after the others
have stopped.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from bench.executors import executor
from bench.loadgen import Mix, run
from bench.machine import describe

POLICIES = ("eager", "lockstep", "opportunistic")
WORKLOADS = {
    # the paper's Table 5 setting: 8 inference clients with different adapters and ranks
    "decode8": {"mix": "decode=8", "ranks": (8, 64), "methods": ("lora", "lora", "ia3")},
    "mixed": {"mix": "decode=5,prefill=2,train=1", "ranks": (8, 64), "methods": ("lora", "ia3")},
}
RESULTS = Path(__file__).parent / "results"


def median_summary(runs: list[dict]) -> dict:
    out: dict = {}
    for kind in ("decode", "prefill", "train"):
        values = [r[kind] for r in runs if kind in r]
        if values:
            out[kind] = {key: statistics.median(v[key] for v in values)
                         for key in ("tokens_per_s", "latency_mean_ms", "latency_p50_ms",
                                     "latency_p99_ms")}
    out["mean_batch_calls"] = statistics.median(r["executor"]["inference"]["mean_batch_calls"]
                                                for r in runs)
    return out


def markdown(summary: dict, ratios: dict) -> str:
    lines = []
    for workload, by_policy in summary.items():
        lines += [f"### {workload} ({WORKLOADS[workload]['mix']})", "",
                  "| policy | kind | tokens/s | mean ms | p50 ms | p99 ms | mean batch (calls) |",
                  "|---|---|---|---|---|---|---|"]
        for policy, s in by_policy.items():
            for kind in ("decode", "prefill", "train"):
                if kind in s:
                    k = s[kind]
                    lines.append(f"| {policy} | {kind} | {k['tokens_per_s']:.1f} | "
                                 f"{k['latency_mean_ms']:.0f} | {k['latency_p50_ms']:.0f} | "
                                 f"{k['latency_p99_ms']:.0f} | {s['mean_batch_calls']:.2f} |")
        r = ratios.get(workload)
        if r is None:
            continue
        lines += ["", f"Opportunistic / eager decode throughput: **{r['throughput']:.2f}x** "
                      f"(goal >= 1.25x); mean decode latency ratio {r['latency']:.2f} "
                      "(goal <= 1.0).", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.batching")
    parser.add_argument("--model", default="llama-160m")
    parser.add_argument("--duration", type=float, default=20)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    parser.add_argument("--device", default="cpu", help="the executor's device (cuda on a GPU)")
    parser.add_argument("--policies", default=",".join(POLICIES),
                        help="a subset to explore with (eager and opportunistic are compared)")
    parser.add_argument("--stem", help="results file name (default batching_policies[_DTYPE])")
    args = parser.parse_args(argv)
    raw: dict = {}
    summary: dict = {}
    for workload in args.workloads.split(","):
        spec = WORKLOADS[workload]
        for policy in args.policies.split(","):
            runs = []
            for _ in range(args.repeats):
                with executor(args.model, policy=policy, threads=args.threads,
                              dtype=args.dtype, device=args.device) as (endpoint, pid):
                    runs.append(run(endpoint, args.model, Mix.parse(spec["mix"]),
                                    duration=args.duration, ranks=spec["ranks"],
                                    methods=spec["methods"], executor_pid=pid))
                sys.stderr.write(f"{workload} {policy}: {json.dumps(runs[-1])}\n")
            raw.setdefault(workload, {})[policy] = runs
            summary.setdefault(workload, {})[policy] = median_summary(runs)
    ratios = {}
    for workload, s in summary.items():
        if not {"eager", "opportunistic"} <= s.keys():
            continue
        eager, opp = s["eager"]["decode"], s["opportunistic"]["decode"]
        ratios[workload] = {"throughput": opp["tokens_per_s"] / eager["tokens_per_s"],
                            "latency": opp["latency_mean_ms"] / eager["latency_mean_ms"]}
    RESULTS.mkdir(parents=True, exist_ok=True)
    command = "python -m bench.batching " + " ".join(argv if argv is not None else sys.argv[1:])
    document = {"machine": describe(), "command": command.strip(), "model": args.model,
                "dtype": args.dtype, "device": args.device, "duration_s": args.duration,
                "repeats": args.repeats,
                "date": time.strftime("%Y-%m-%d"), "summary": summary, "ratios": ratios,
                "runs": raw}
    stem = args.stem or "batching_policies" + "".join(
        f"_{v}" for v, default in ((args.dtype, "float32"), (args.device.split(":")[0], "cpu"))
        if v != default)
    (RESULTS / f"{stem}.json").write_text(json.dumps(document, indent=1))
    table = markdown(summary, ratios)
    gpu = f", {document['machine']['gpu']}" if document["machine"]["gpu"] else ""
    (RESULTS / f"{stem}.md").write_text(
        f"# Batching policies\n\n`{document['command']}` on {document['machine']['cpu']} "
        f"({document['machine']['cores']} cores{gpu}), model {args.model}, executor "
        f"{args.dtype} on {args.device}, "
        f"{args.duration:.0f} s per run, median of {args.repeats}.\n\n{table}\n")
    sys.stdout.write(table + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

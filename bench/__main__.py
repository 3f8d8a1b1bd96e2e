"""`python -m bench run [--quick] [--device cuda --dtype bfloat16 [--mps]] [SCENARIO ...]` |
`python -m bench list` |
`python -m bench compare RUN.json ...` (runs side by side, with the median ratio) |
`python -m bench report RUN.json ...` (bench/RESULTS.md from results JSON, `bench.report`) |
`python -m bench gpu-check` (accept or refuse a GPU host in ten minutes, `bench.gpucheck`).

Runs each scenario for Symbiosis and for its baseline (plain transformers + peft) in the same run
on the same machine, prints a markdown table, writes bench/results/latest.json and PNG plots.
Without names it runs the CPU scenarios, or with a `--device` other than cpu the GPU ones
(`bench.scenarios.gpu`), which `--device cpu --toy` checks on a machine without a GPU.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

from bench import plots
from bench.compare import compare
from bench.gpu import mps
from bench.machine import describe
from bench.measure import matmul_peak_gflops
from bench.records import Record, table, write_json
from bench.scenarios import (
    adapters,
    chunks,
    embeddings,
    flex,
    inference,
    overhead,
    pacing,
    sharding,
    targets,
    tenants,
    trace,
    trace_mixed,
    training,
)
from bench.scenarios.common import Settings
from bench.scenarios.gpu import GPU_SCENARIOS

RESULTS = Path(__file__).parent / "results"


def _with_plot(settings: Settings) -> list[Record]:
    """Aggregate training tokens/s at N = 1, 2, 4, 8 jobs, small and large steps (+ plot)."""
    records, curves = training.throughput(settings)
    plots.throughput(curves, settings.results / "throughput.png")
    return records


SCENARIOS: dict[str, Callable[[Settings], list[Record]]] = {
    "memory": training.memory,
    "capacity": training.capacity,
    "throughput": _with_plot,
    "shapes": training.shapes,
    "chat": training.chat,
    "dpo": training.dpo,
    "decode": inference.decode,
    "policies": trace.policy_records,
    "together": inference.together,
    "mixed": inference.mixed,
    "mixed-idle": inference.mixed_idle,
    "mixed-trace": trace_mixed.mixed_trace,
    "targets": targets.own_target,
    "pacing": pacing.inter_token_target,
    "privacy": inference.privacy,
    "overhead": overhead.per_call,
    "rate": overhead.executor_rate,
    "methods": inference.methods,
    "coldstart": overhead.cold_start,
    "sharding": sharding.sharded,
    "adapters": adapters.many_adapters,
    "embeddings": embeddings.embeddings,
    "flex": flex.flex,
    "tenants": tenants.many_tenants,
    "long-prompts": chunks.long_prompts,
    "mixed-lengths": chunks.mixed_lengths,
}
QUICK_SKIP = {"capacity"}  # ~1B model: minutes per step on a small CPU


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run")
    run.add_argument("--quick", action="store_true", help="short runs (~15 min on 2 cores)")
    run.add_argument("--toy", action="store_true",
                     help="check the harness only: tiny model, 2 clients, 2-second windows")
    run.add_argument("--out", type=Path, default=RESULTS / "latest.json")
    run.add_argument("--device", default="cpu", help="the executor's and plain side's device")
    run.add_argument("--dtype", default=None, choices=["float32", "bfloat16", "float16"],
                     help="both sides' weights (default: float32 on cpu, bfloat16 on a GPU)")
    run.add_argument("--worker-device", help="where our clients run (default: --device)")
    run.add_argument("--window-s", type=float, help="each measured window, seconds "
                     "(default: 30, 6 with --quick, 2 with --toy)")
    run.add_argument("--mps", action="store_true",
                     help="run everything under NVIDIA MPS (both sides alike)")
    run.add_argument("scenarios", nargs="*", choices=[*SCENARIOS, *GPU_SCENARIOS, []],
                     default=[])
    sub.add_parser("list")
    runs = sub.add_parser("compare")
    runs.add_argument("runs", nargs="+", type=Path)
    sub.add_parser("report", add_help=False)
    sub.add_parser("gpu-check", add_help=False,
                   help="accept or refuse a GPU host in ten minutes (bench.gpucheck)")
    if argv is None:
        argv = sys.argv[1:]
    if argv[:1] == ["report"]:
        from bench.report import main as report

        return report(argv[1:])
    if argv[:1] == ["gpu-check"]:
        from bench.gpucheck import main as gpu_check

        return gpu_check(argv[1:])
    args = parser.parse_args(argv)
    if args.command == "compare":
        sys.stdout.write(compare(args.runs) + "\n")
        return 0
    if args.command == "list":
        for name, fn in {**SCENARIOS, **GPU_SCENARIOS}.items():
            summary = (fn.__doc__ or "").strip().splitlines() or [""]
            sys.stdout.write(f"{name:12} {summary[0]}\n")
        return 0
    scenarios = {**SCENARIOS, **GPU_SCENARIOS}
    names = args.scenarios or (list(GPU_SCENARIOS) if args.device != "cpu" else
                               [n for n in SCENARIOS if not (args.quick and n in QUICK_SKIP)])
    torch.set_num_threads(os.cpu_count() or 2)
    dtype = args.dtype or ("float32" if args.device == "cpu" else "bfloat16")
    settings = Settings(quick=args.quick, toy=args.toy, results=args.out.parent,
                        peak_gflops=matmul_peak_gflops(seconds=0.5 if args.toy else 3.0),
                        device=args.device, dtype=dtype, worker_device=args.worker_device,
                        window_s=args.window_s)
    settings.results.mkdir(parents=True, exist_ok=True)
    records: list[Record] = []
    started = time.monotonic()
    try:
        with mps(args.mps):
            records = _run(names, scenarios, settings, args, argv, started)
    finally:
        settings.close()
    meta = _meta(argv, settings, started)
    machine = meta["machine"]
    gpu = f", {machine['gpu']}" if machine["gpu"] else ""
    header = (f"`{meta['command']}`, {meta['date']}, {machine['cpu']} ({machine['cores']} cores, "
              f"{machine['memory_gb']} GB{gpu}), torch {machine['torch']}, {settings.device} "
              f"{settings.dtype}, measured fp32 matmul peak {settings.peak_gflops:.0f} GFLOP/s, "
              f"{meta['elapsed_s'] / 60:.0f} min\n\n")
    args.out.with_suffix(".md").write_text(header + table(records) + "\n")
    sys.stdout.write(table(records) + "\n")
    return 0


def _run(names: list[str], scenarios: dict, settings: Settings, args: argparse.Namespace,
         argv: list[str] | None, started: float) -> list[Record]:
    records: list[Record] = []
    for name in names:
        sys.stderr.write(f"== {name}\n")
        t = time.monotonic()
        try:
            records += scenarios[name](settings)
        except Exception as exc:  # report and go on: one scenario must not lose the others
            sys.stderr.write(f"scenario {name} failed: {type(exc).__name__}: {exc}\n")
            records.append(Record(name, f"FAILED: {type(exc).__name__}: {exc}"[:120],
                                  float("nan"), None))
        sys.stderr.write(f"   {time.monotonic() - t:.0f} s\n")
        write_json(args.out, records, _meta(argv, settings, started))
    return records


def _meta(argv: list[str] | None, settings: Settings, started: float) -> dict:
    command = "python -m bench " + " ".join(sys.argv[1:] if argv is None else argv)
    return {"command": command, "machine": describe(), "date": time.strftime("%Y-%m-%d %H:%M"),
            "quick": settings.quick, "matmul_peak_gflops": settings.peak_gflops,
            "device": settings.device, "dtype": settings.dtype,
            "worker_device": settings.client_device,
            "elapsed_s": time.monotonic() - started}


if __name__ == "__main__":
    raise SystemExit(main())

"""`python -m bench.stepprofile [--device cuda --dtype bfloat16 --model llama-1b]`: where one
fine-tuning step's time goes, ours against plain transformers + peft.

Both sides run the bench's training step (LoRA on q/v, AdamW, labels = inputs, gradient
clipping) on the same device, each in its own process, best of `--steps` after a warm-up (ours
as a lone trainer runs: at its priority, with its allocator setting, on the threads it takes for
the step's tokens, `workers.training` and `workers.threads`; plain at torch's defaults). Ours is
split into the time spent inside executor calls as the client sees them (`calls_ms`), of which
the executor's compute for them (`executor_ms`, its own statistics) and the rest
(`overhead_ms`: transfer, waiting, synchronization), and the client's own work (`client_ms`:
attention, norms, the adapter, backward glue, optimizer). One profiled step of ours adds
torch.profiler's top operators by self CPU time (by CUDA time on a GPU); `--executor-profile`
runs the executor itself under the profiler too (`bench.profiled`), for the other side of a call.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from bench.executors import executor
from bench.loops import train_step
from bench.models import build
from bench.sides import environment

TOP_OPS = 25


class CallClock:
    """Wraps an executor client's `call`: how many calls and how long they took."""

    def __init__(self, client) -> None:
        self.client, self.calls, self.seconds = client, 0, 0.0
        self._call = client.call
        client.call = self._timed

    def _timed(self, *args, **kwargs):
        started = time.perf_counter()
        try:
            return self._call(*args, **kwargs)
        finally:
            self.calls += 1
            self.seconds += time.perf_counter() - started

    def read(self) -> tuple[int, float, float]:
        """(calls, seconds in them, the executor's compute seconds so far)."""
        figures = self.client.stats()
        return self.calls, self.seconds, sum(k.compute_s for k in figures.kinds.values())


def _trainable(model):
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    return params, torch.optim.AdamW(params, lr=1e-4)


def measure(args: argparse.Namespace) -> dict:
    """Each side in its own process, as the bench's clients are: two models' attention
    backward in one CUDA process failed in cuDNN on an H100 (bench/NOTES.md)."""
    with executor(args.model, dtype=args.dtype, device=args.device,
                  profile=args.executor_profile) as (endpoint, _):
        sides = {side: _side_process(args, side, endpoint) for side in ("plain", "ours")}
    ours, plain = sides["ours"], sides["plain"]
    return {"model": args.model, "device": args.device, "dtype": args.dtype,
            "batch": args.batch, "length": args.length, "steps": args.steps,
            "plain_ms": plain["step_ms"], "plain_median_ms": plain["median_ms"],
            "ours_ms": ours["step_ms"], "ours_median_ms": ours["median_ms"],
            "ratio": plain["step_ms"] / ours["step_ms"], "plain_threads": plain["threads"],
            "plain_nice": plain["nice"],
            **{k: v for k, v in ours.items() if k not in ("step_ms", "median_ms")}}


def _side_process(args: argparse.Namespace, side: str, endpoint: str) -> dict:
    command = [sys.executable, "-m", "bench.stepprofile", "--side", side, "--endpoint", endpoint,
               "--model", args.model, "--device", args.device, "--dtype", args.dtype,
               "--batch", str(args.batch), "--length", str(args.length),
               "--warmup", str(args.warmup), "--steps", str(args.steps)]
    run = subprocess.run(command, stdout=subprocess.PIPE, text=True, check=True,
                         env=environment(side))  # each side at its defaults (`bench.sides`)
    return json.loads(run.stdout.strip().splitlines()[-1])


def side(args: argparse.Namespace) -> dict:
    """One side's steps: the best and the median, and for ours where the best one's time
    went and one profiled step."""
    dtype = getattr(torch, args.dtype)
    if args.side == "ours":  # as a lone trainer runs: its priority, allocator and threads
        from workers.threads import step_threads
        from workers.training.process import run_as_trainer

        run_as_trainer()
        torch.set_num_threads(step_threads(torch.get_num_threads(), args.batch * args.length))
    ids = torch.randint(0, 1000, (args.batch, args.length),
                        generator=torch.Generator().manual_seed(0)).to(args.device)
    model = build(args.side, args.model, args.endpoint, "lora", 8, 0, training=True,
                  device=args.device, dtype=dtype)
    params, optimizer = _trainable(model)
    clock = CallClock(model.symbiosis_executor) if args.side == "ours" else None
    steps = []
    for step in range(args.warmup + args.steps):
        before = clock.read() if clock else ()
        seconds = train_step(model, optimizer, params, ids)
        sys.stderr.write(f"step {step} {args.side}: {1e3 * seconds:.1f} ms\n")
        if step >= args.warmup:
            after = clock.read() if clock else ()
            steps.append((seconds, *(b - a for a, b in zip(before, after, strict=True))))
    best = min(steps)
    result = {"step_ms": 1e3 * best[0], "threads": torch.get_num_threads(), "nice": os.nice(0),
              "median_ms": 1e3 * statistics.median(s[0] for s in steps)}
    if clock:
        step_s, calls, in_calls, computed = best
        result |= {"calls": calls, "calls_ms": 1e3 * in_calls, "executor_ms": 1e3 * computed,
                   "overhead_ms": 1e3 * (in_calls - computed),
                   "client_ms": 1e3 * (step_s - in_calls),
                   "per_call_us": 1e6 * in_calls / max(calls, 1),
                   "profile": _profile(model, params, optimizer, ids)}
    return result


def _profile(model, params, optimizer, ids: torch.Tensor) -> str:
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    if ids.device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    with profile(activities=activities) as prof:
        train_step(model, optimizer, params, ids)
    key = "self_cuda_time_total" if ids.device.type == "cuda" else "self_cpu_time_total"
    return prof.key_averages().table(sort_by=key, row_limit=TOP_OPS, max_name_column_width=48)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.stepprofile", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny-llama")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--length", type=int, default=512)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--executor-profile", type=Path,
                        help="the executor's own top operators over both sides' steps, written "
                             "here (`bench.profiled`; its timings then are not results)")
    parser.add_argument("--side", choices=["ours", "plain"], help=argparse.SUPPRESS)
    parser.add_argument("--endpoint", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.side:
        sys.stdout.write(json.dumps(side(args)) + "\n")
        return 0
    result = measure(args)
    shown = {k: v for k, v in result.items() if k != "profile"}
    sys.stdout.write(json.dumps(shown, indent=1) + "\n" + result["profile"] + "\n")
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

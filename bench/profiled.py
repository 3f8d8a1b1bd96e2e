"""`python -m bench.profiled --out TABLE.txt -- EXECUTOR_ARGS`: an executor (`python -m
executor EXECUTOR_ARGS`) run under torch.profiler from start to stop, every thread of it (the
compute loop runs in the server's own), which on stopping writes its top operators to TABLE.txt:
by self host time and, on a GPU, by kernel time. What the executor spends a call on, where the
client side's profile (`bench.stepprofile`) sees only the time a call took.

For benchmarks only (`bench.executors.ExecutorProcess(profile=...)`): profiling slows every
operator down, so a profiled run's timings are not results.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

TOP_OPS = 40


def all_threads() -> dict:
    """The profiler's option to record threads started after it (the server's), where this
    torch has it; without it only the main thread's work would show."""
    try:
        from torch._C._profiler import _ExperimentalConfig

        return {"experimental_config": _ExperimentalConfig(profile_all_threads=True)}
    except (ImportError, TypeError):
        return {}


def tables(prof, on_gpu: bool) -> str:
    averages = prof.key_averages()
    parts = [f"== by self host time (top {TOP_OPS})",
             averages.table(sort_by="self_cpu_time_total", row_limit=TOP_OPS,
                            max_name_column_width=56)]
    if on_gpu:
        parts += [f"== by kernel time (top {TOP_OPS})",
                  averages.table(sort_by="self_cuda_time_total", row_limit=TOP_OPS,
                                 max_name_column_width=56)]
    return "\n".join(parts) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.profiled", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="where the tables go")
    parser.add_argument("executor_args", nargs=argparse.REMAINDER,
                        help="after `--`: the executor's own arguments")
    args = parser.parse_args(argv)
    executor_args = [a for a in args.executor_args if a != "--"]
    from executor.__main__ import main as run_executor
    from executor.__main__ import parse_args

    on_gpu = parse_args(executor_args).device.startswith("cuda") and torch.cuda.is_available()
    activities = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if on_gpu else [])]
    options = all_threads()
    with profile(activities=activities, **options) as prof:
        code = run_executor(executor_args)
    note = "" if options else "this torch records the main thread only\n"
    args.out.write_text(note + tables(prof, on_gpu))
    return code


if __name__ == "__main__":
    sys.exit(main())

"""A group of benchmark clients of one side, started together and measured together.

Baseline clients are separate processes (what a user would run otherwise); ours are forked
from one preloaded parent, as the worker manager does. All wait at a barrier (files in a sync
directory) until every client has built its model, then run for the same window.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench.measure import PeakPss

ENV = {"OMP_WAIT_POLICY": "PASSIVE", "TOKENIZERS_PARALLELISM": "false"}


@dataclass
class GroupResult:
    results: list[dict]
    peak_pss: int
    setup_s: float

    def tokens_per_s(self, kind: str | None = None) -> float:
        mine = [r for r in self.results if kind is None or r["kind"] == kind]
        tokens = sum(len(r["latencies"]) * r["tokens_per_unit"] for r in mine)
        window = max(r["elapsed"] for r in mine)
        return tokens / window if window else 0.0

    def latency_ms(self, q: float | None = None, kind: str | None = None) -> float:
        values = sorted(x for r in self.results if kind is None or r["kind"] == kind
                        for x in r["latencies"])
        if not values:
            return float("nan")
        if q is None:
            return 1e3 * statistics.fmean(values)
        return 1e3 * values[min(len(values) - 1, int(q * len(values)))]


@dataclass
class Group:
    argvs: list[list[str]]
    forked: bool
    extra_pids: list[int] = field(default_factory=list)  # e.g. the executor, for memory

    def run(self, timeout_s: float = 1800) -> GroupResult:
        sync = Path(tempfile.mkdtemp(prefix="symb-bench-"))
        argvs = [[*a, "--sync-dir", str(sync), "--index", str(i)]
                 for i, a in enumerate(self.argvs)]
        env = {**os.environ, **ENV}
        started = time.monotonic()
        if self.forked:
            (sync / "args.json").write_text(json.dumps(argvs))
            procs = [subprocess.Popen([sys.executable, "-m", "bench.forked",
                                       str(sync / "args.json")], env=env)]
        else:
            procs = [subprocess.Popen([sys.executable, "-m", "bench.workload", *a], env=env)
                     for a in argvs]
        try:
            self._wait(lambda: all((sync / f"{i}.ready").exists() for i in range(len(argvs))),
                       procs, timeout_s)
            setup = time.monotonic() - started
            with PeakPss(lambda: [p.pid for p in procs] + self.extra_pids) as pss:
                (sync / "go").touch()
                self._wait(lambda: all(p.poll() is not None for p in procs), [], timeout_s)
            if any(p.returncode for p in procs):
                raise RuntimeError("a benchmark client failed")
            results = [json.loads((sync / f"{i}.json").read_text()) for i in range(len(argvs))]
            return GroupResult(results, pss.peak, setup)
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
            shutil.rmtree(sync, ignore_errors=True)

    @staticmethod
    def _wait(done, procs, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not done():
            if any(p.poll() not in (None, 0) for p in procs):
                raise RuntimeError("a benchmark client exited before it was ready")
            if time.monotonic() > deadline:
                raise TimeoutError("benchmark clients did not finish in time")
            time.sleep(0.05)

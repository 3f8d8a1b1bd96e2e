"""A group of benchmark clients of one side, started together and measured together.

Baseline clients are separate processes (what a user would run otherwise); ours are forked
from one preloaded parent, as the worker manager does. All wait at a barrier (files in a sync
directory) until every client has built its model, then run for the same window. A held client
(`--held`) runs on past its window until the others are done (the directory's `release` file),
so that all they measure ran beside it.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from bench.gpu import GpuReading, GpuSampler
from bench.measure import PeakPss
from bench.quantiles import quantile_ms
from bench.sides import environment
from bench.zygote import Zygote


@dataclass
class GroupResult:
    results: list[dict]
    peak_pss: int
    setup_s: float
    gpu: GpuReading | None = None  # sampled while the group ran, when asked and possible

    def tokens_per_s(self, kind: str | None = None) -> float:
        """Each client's tokens over its own window (to its last completed unit), summed."""
        return sum(rate for r, rate in zip(self.results, self.each_tokens_per_s(), strict=True)
                   if kind is None or r["kind"] == kind)

    def each_tokens_per_s(self) -> list[float]:
        """Each client's tokens over its own window, in the order the clients were given."""
        return [len(r["latencies"]) * r["tokens_per_unit"] / r["elapsed"] if r["elapsed"]
                else 0.0 for r in self.results]

    def calls_per_token(self, kind: str = "decode") -> float:
        """Executor calls per token (prefills included), over every client that counted."""
        counted = [r for r in self.results if r["kind"] == kind and r.get("executor_calls")]
        tokens = sum(len(r["latencies"]) * r["tokens_per_unit"] for r in counted)
        return sum(r["executor_calls"] for r in counted) / tokens if tokens else float("nan")

    def first_tokens(self) -> list[float]:
        """Decode clients' times to first token (prefill included), seconds, shortest first."""
        return sorted(x for r in self.results for x in r.get("first_tokens", []))

    def first_token_ms(self, q: float) -> float:
        """The q-quantile of decode clients' time to first token (prefill included)."""
        return quantile_ms(self.first_tokens(), q)

    def latency_ms(self, q: float | None = None, kind: str | None = None) -> float:
        values = sorted(x for r in self.results if kind is None or r["kind"] == kind
                        for x in r["latencies"])
        if q is None:
            return 1e3 * statistics.fmean(values) if values else float("nan")
        return quantile_ms(values, q)


@dataclass
class Group:
    argvs: list[list[str]]
    forked: bool
    extra_pids: list[int] = field(default_factory=list)  # e.g. the executor, for memory
    zygote: Zygote | None = None  # the run's preloaded parent; else one just for this group
    gpu: bool = False  # sample the GPU's memory and utilization through the window
    side: str = "ours"  # whose environment the clients get (`bench.sides`)
    at_go: Callable[[], object] | None = None  # called as the window opens (warm-ups done)

    def run(self, timeout_s: float = 1800) -> GroupResult:
        sync = Path(tempfile.mkdtemp(prefix="symb-bench-"))
        argvs = [[*a, "--sync-dir", str(sync), "--index", str(i)]
                 for i, a in enumerate(self.argvs)]
        env = environment(self.side)
        started = time.monotonic()
        zygote = (self.zygote or Zygote(env)) if self.forked else None
        clients = zygote.launch(argvs) if zygote else \
            _Processes([subprocess.Popen([sys.executable, "-m", "bench.workload", *a], env=env)
                        for a in argvs])
        parents = [zygote.pid] if zygote else clients.pids  # their trees hold every client
        try:
            ready = lambda: all((sync / f"{i}.ready").exists() for i in range(len(argvs)))  # noqa: E731
            self._wait(lambda: ready() or clients.any_exited(), timeout_s)
            if not ready():
                raise RuntimeError("a benchmark client exited before it was ready")
            setup = time.monotonic() - started
            sampler = GpuSampler() if self.gpu and GpuSampler.available() else None
            with PeakPss(lambda: parents + self.extra_pids) as pss, \
                    sampler or contextlib.nullcontext():
                if self.at_go is not None:
                    self.at_go()
                (sync / "go").touch()
                self._release(sync, clients, timeout_s)
                self._wait(clients.done, timeout_s)
            if clients.failed:
                raise RuntimeError("a benchmark client failed")
            results = [json.loads((sync / f"{i}.json").read_text()) for i in range(len(argvs))]
            ran = time.monotonic() - started - setup
            sys.stderr.write(f"   {len(argvs)} {'forked' if zygote else 'fresh'} clients: ready "
                             f"in {setup:.0f} s, ran {ran:.0f} s\n")
            return GroupResult(results, pss.peak, setup, sampler.reading if sampler else None)
        finally:
            clients.kill()
            if zygote is not None and zygote is not self.zygote:
                zygote.close()
            shutil.rmtree(sync, ignore_errors=True)

    def _release(self, sync: Path, clients, timeout_s: float) -> None:
        """Let the held clients end their windows once the others have written their results
        (or all have exited: a held client's window ends by itself at last, `HELD_MAX_S`)."""
        held = [i for i, argv in enumerate(self.argvs) if "--held" in argv]
        if held:
            others = [i for i in range(len(self.argvs)) if i not in held]
            self._wait(lambda: all((sync / f"{i}.json").exists() for i in others)
                       or clients.done(), timeout_s)
        (sync / "release").touch()

    @staticmethod
    def _wait(done, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not done():
            if time.monotonic() > deadline:
                raise TimeoutError("benchmark clients did not finish in time")
            time.sleep(0.05)


class _Processes:
    """Fresh interpreters, one per client (what a user would start)."""

    def __init__(self, procs: list[subprocess.Popen]) -> None:
        self.procs = procs
        self.pids = [p.pid for p in procs]

    @property
    def failed(self) -> int:
        return sum(p.returncode not in (None, 0) for p in self.procs)

    def done(self) -> bool:
        return all(p.poll() is not None for p in self.procs)

    def any_exited(self) -> bool:
        return any(p.poll() is not None for p in self.procs)

    def kill(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()

"""Inference beside fine-tuning on the Azure trace (6b), through the whole stack.

One stack, its defaults (the default policy; on a CPU the jobs on the idle twin): the trace's
replay (`bench.scenarios.trace`: 8 tenants, each with its own LoRA adapter, streaming completions
over HTTP) alone; then again while two tenants' fine-tuning jobs run, submitted through the
fine-tuning API; then the jobs alone for as long as that replay took. The tenants' time to first
token and per-token latency with the jobs against the replay alone, and the jobs' training
tokens/s during the replay against the jobs alone, read from their metrics events
(`trained_tokens` at each step, sampled as the steps end), each window stretched to the step
ends around it.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
import threading
import time
from pathlib import Path

import httpx

from bench.records import Record
from bench.scenarios.common import Settings
from bench.scenarios.trace import (
    TENANTS,
    api_keys,
    auth,
    load_trace,
    register_adapters,
    replay,
    summarize,
    tenant_adapters,
)

SCENARIO = "6b mixed on the Azure trace"
JOBS = 2  # owned by tenants t0 and t1, who also send their share of the trace
EXAMPLES = 64
SAMPLE_S = 0.2


def training_file() -> bytes:
    """Chat examples of ~70 tokens each (one answer, varied by the item's number)."""
    rows = [{"messages": [
        {"role": "user", "content": f"Describe item {i} of the inventory in a few sentences."},
        {"role": "assistant", "content": f"Item {i} is a brass lantern with a green glass "
         "shade, kept on the third shelf beside the maps; it was last cleaned in spring, its "
         "wick is new, and it burns for about six hours on one filling of oil."}]}
        for i in range(EXAMPLES)]
    return "\n".join(json.dumps(r) for r in rows).encode()


def submit(http: httpx.Client, tenant: int, model: str) -> str:
    upload = http.post("/v1/files", headers=auth(tenant), data={"purpose": "fine-tune"},
                       files={"file": ("inventory.jsonl", training_file())})
    upload.raise_for_status()
    job = http.post("/v1/fine_tuning/jobs", headers=auth(tenant), json={
        "model": model, "training_file": upload.json()["id"], "suffix": "bench", "seed": 7,
        "method": {"type": "supervised", "supervised": {"hyperparameters": {
            "n_epochs": 50, "batch_size": 2}}},
        "peft": {"method": "lora", "r": 8}})
    job.raise_for_status()
    return job.json()["id"]


class StepClock:
    """Samples each job's `trained_tokens` from its newest metrics events: (when a step's end
    was seen, tokens so far) per job."""

    def __init__(self, http: httpx.Client, jobs: dict[str, int]) -> None:
        self.http, self.jobs = http, jobs
        self.seen: dict[str, list[tuple[float, int]]] = {job: [] for job in jobs}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> StepClock:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(SAMPLE_S):
            for job, tenant in self.jobs.items():
                tokens = self.tokens(job, tenant)
                marks = self.seen[job]
                if tokens and (not marks or tokens > marks[-1][1]):
                    marks.append((time.monotonic(), tokens))

    def tokens(self, job: str, tenant: int) -> int:
        response = self.http.get(f"/v1/fine_tuning/jobs/{job}/events", params={"limit": 5},
                                 headers=auth(tenant))
        events = response.json().get("data", []) if response.is_success else []
        return max((e["data"]["trained_tokens"] for e in events
                    if e.get("type") == "metrics" and "trained_tokens" in (e.get("data") or {})),
                   default=0)

    def wait_steps(self, steps: int, timeout: float = 600) -> None:
        deadline = time.monotonic() + timeout
        while min(len(marks) for marks in self.seen.values()) < steps:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the jobs did not reach step {steps}: {self.seen}")
            time.sleep(SAMPLE_S)

    def wait_past(self, moment: float, timeout: float = 600) -> None:
        """Until every job has a step end seen after `moment`."""
        deadline = time.monotonic() + timeout
        while min((marks[-1][0] if marks else 0.0) for marks in self.seen.values()) <= moment:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the jobs ended no step after {moment:.1f}: {self.seen}")
            time.sleep(SAMPLE_S)

    def rate(self, start: float, end: float) -> float:
        """Tokens per second of all jobs together over `start`..`end`: each job's tokens
        between the step ends that bound the window (its last at or before `start` and its
        first at or after `end`, where it has them), over that time, so that a window shorter
        than a slow step still has a rate."""
        total = 0.0
        for marks in self.seen.values():
            before = [i for i, m in enumerate(marks) if m[0] <= start]
            after = [i for i, m in enumerate(marks) if m[0] >= end]
            first, last = (before[-1] if before else 0), (after[0] if after else len(marks) - 1)
            if last <= first:
                raise RuntimeError(f"fewer than two steps of a job around the window: {marks}")
            total += ((marks[last][1] - marks[first][1])
                      / (marks[last][0] - marks[first][0]))
        return total


def replay_beside_jobs(base_url: str, trace: list[tuple], tenants: int,
                       model: str) -> tuple[dict, dict, float, float]:
    """The trace alone, then beside the jobs; the jobs' tokens/s beside it, then by themselves
    for as long."""
    asyncio.run(replay(base_url, [(0.0, 8, 2)] * tenants, tenants))  # adapters in
    alone = summarize(asyncio.run(replay(base_url, trace, tenants)))
    with httpx.Client(base_url=base_url, timeout=60) as http:
        jobs = {submit(http, tenant, model): tenant for tenant in range(JOBS)}
        clock = StepClock(http, jobs).start()
        try:
            clock.wait_steps(1)
            started = time.monotonic()
            together = summarize(asyncio.run(replay(base_url, trace, tenants)))
            ended = time.monotonic()
            time.sleep(ended - started)
            alone_until = time.monotonic()
            clock.wait_past(alone_until)
            return alone, together, clock.rate(started, ended), clock.rate(ended, alone_until)
        finally:
            clock.stop()
            for job, tenant in jobs.items():
                http.post(f"/v1/fine_tuning/jobs/{job}/cancel", headers=auth(tenant))


def mixed_trace(settings: Settings) -> list[Record]:
    from launcher.ports import free_port
    from launcher.stack import Stack

    n, stretch = (8, 1.0) if settings.toy else (16, 3.0) if settings.quick else (120, 6.0)
    trace = load_trace(n, stretch, prompt_scale=16, output_scale=8)
    tenants = settings.n(TENANTS)
    with tempfile.TemporaryDirectory(prefix="symb-trace-mixed-") as scratch:
        root = Path(scratch)
        register_adapters(root / "data", settings.model,
                          tenant_adapters(root, settings.model, tenants))
        stack = Stack(root / "data", settings.model, port=free_port(),
                      env={"SYMBIOSIS_API_KEYS": api_keys(tenants)},
                      manager_args=("--max-jobs", str(JOBS)),
                      executor_args=("--threads", str(settings.threads))).start()
        try:
            alone, together, beside, by_themselves = replay_beside_jobs(
                stack.base_url, trace, tenants, settings.model)
        finally:
            stack.stop()
    note = f"{n} requests, {tenants} tenants, arrivals x{stretch:g}; {JOBS} LoRA jobs, batch 2"
    records = [Record(SCENARIO, f"{label}, trace + {JOBS} jobs vs the trace alone",
                      together[key], alone[key], "ms", goal, higher_is_better=False)
               for key, label, goal in (("ttft_p50_ms", "time to first token p50", ""),
                                        ("ttft_p99_ms", "time to first token p99", "<= 1.3x"),
                                        ("token_p50_ms", "per-token latency p50", "<= 1.2x"),
                                        ("token_p99_ms", "per-token latency p99", ""))]
    records.append(Record(SCENARIO, f"training tokens/s during the replay vs the {JOBS} jobs "
                          "alone", beside, by_themselves, "tok/s", ">= 0.5x", note=note))
    return records

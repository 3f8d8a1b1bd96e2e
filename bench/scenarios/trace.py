"""Batching policies (5) on a replay of the Azure LLM conversation trace, through the whole stack.

Requests arrive as in the trace (inter-arrival times stretched by a constant so a 2-core machine
keeps up), with prompt and output lengths scaled down; 8 tenants, each with its own LoRA adapter,
stream completions over HTTP. Per policy: throughput (generated tokens over the makespan), time
to first token and per-token latency (gaps between streamed tokens).
"""

from __future__ import annotations

import asyncio
import copy
import csv
import json
import statistics
import tempfile
import time
from pathlib import Path

import httpx

from bench.quantiles import quantile_ms
from bench.records import Record
from bench.scenarios.common import Settings

TRACE = Path(__file__).parents[2] / "tests" / "data" / "azure_llm_2023_conv_first2000.csv"
TENANTS = 8


def load_trace(n: int, stretch: float, prompt_scale: float, output_scale: float) -> list[tuple]:
    """(arrival s, prompt tokens, output tokens) for the first n requests."""
    rows = list(csv.DictReader(TRACE.open()))[:n]

    def stamp(text: str) -> float:
        clock = text.split(" ")[1]
        h, m, s = clock.split(":")
        return int(h) * 3600 + int(m) * 60 + float(s)

    start = stamp(rows[0]["TIMESTAMP"])
    return [((stamp(r["TIMESTAMP"]) - start) * stretch,
             max(4, min(256, round(int(r["ContextTokens"]) / prompt_scale))),
             max(2, min(64, round(int(r["GeneratedTokens"]) / output_scale)))) for r in rows]


def api_keys(tenants: int) -> str:
    """SYMBIOSIS_API_KEYS for tenants t0, t1, ... with keys sk-t0, sk-t1, ..."""
    return ",".join(f"t{i}=sk-t{i}" for i in range(tenants))


def auth(tenant: int) -> dict[str, str]:
    return {"Authorization": f"Bearer sk-t{tenant}"}


async def _request(client: httpx.AsyncClient, tenant: int, prompt: int, output: int,
                   at: float, t0: float, out: list) -> None:
    await asyncio.sleep(max(0.0, t0 + at - time.monotonic()))
    ids = [1000 + (i * 7) % 40000 for i in range(prompt)]
    body = {"model": f"t{tenant}/adapter", "prompt": ids, "max_tokens": output,
            "temperature": 0, "stream": True, "ignore_eos": True}
    sent = time.monotonic()
    stamps = []
    async with client.stream("POST", "/v1/completions", json=body,
                             headers=auth(tenant)) as response:
        async for line in response.aiter_lines():
            if line.startswith("data: {") and '"text"' in line and \
                    json.loads(line[6:])["choices"][0]["text"]:
                stamps.append(time.monotonic())
    out.append({"sent": sent, "stamps": stamps, "tokens": len(stamps)})


async def replay(base_url: str, trace: list[tuple], tenants: int) -> list[dict]:
    results: list[dict] = []
    limits = httpx.Limits(max_connections=512)
    async with httpx.AsyncClient(base_url=base_url, timeout=600, limits=limits) as client:
        t0 = time.monotonic() + 1
        await asyncio.gather(*(_request(client, i % tenants, p, o, at, t0, results)
                               for i, (at, p, o) in enumerate(trace)))
    return results


def summarize(results: list[dict]) -> dict:
    done = [r for r in results if r["stamps"]]
    tokens = sum(r["tokens"] for r in done)
    makespan = max(r["stamps"][-1] for r in done) - min(r["sent"] for r in done)
    ttft = sorted(r["stamps"][0] - r["sent"] for r in done)
    gaps = sorted(b - a for r in done for a, b in zip(r["stamps"], r["stamps"][1:], strict=False))
    return {"tokens_per_s": tokens / makespan, "ttft_p50_ms": quantile_ms(ttft, .5),
            "ttft_p99_ms": quantile_ms(ttft, .99), "token_p50_ms": quantile_ms(gaps, .5),
            "token_p99_ms": quantile_ms(gaps, .99),
            "token_mean_ms": 1e3 * statistics.fmean(gaps), "completed": len(done),
            "requests": len(results)}


def tenant_adapters(root: Path, model: str, tenants: int) -> list[Path]:
    """One LoRA adapter per tenant (ranks 8 to 64), in PEFT format."""
    from peft import get_peft_model
    from transformers import AutoModelForCausalLM

    from bench.models import adapter
    from catalogue.resolve import resolve_model

    directories = []
    base = AutoModelForCausalLM.from_pretrained(resolve_model(model))
    for tenant in range(tenants):
        directory = root / f"adapter-{tenant}"
        get_peft_model(copy.deepcopy(base), adapter("lora", (8, 16, 32, 64)[tenant % 4])) \
            .save_pretrained(directory)
        directories.append(directory)
    return directories


def register_adapters(data_dir: Path, model: str, adapters: list[Path]) -> None:
    from state.db import Database, db_path
    from workers.manager.adapter_store import AdapterRegistry
    from workers.manager.records import writing

    with writing(data_dir):  # before the stack starts: as the data dir's writer
        registry = AdapterRegistry(Database(db_path(data_dir)), data_dir, model)
        for tenant, directory in enumerate(adapters):
            registry.register(f"t{tenant}", "adapter", directory)


def replay_under(policy: str, data_dir: Path, adapters: list[Path], trace: list[tuple],
                 settings: Settings) -> dict:
    """The trace's replay through a whole stack of its own, its executor under `policy`."""
    from launcher.ports import free_port
    from launcher.stack import Stack

    tenants = len(adapters)
    register_adapters(data_dir, settings.model, adapters)
    stack = Stack(data_dir, settings.model, port=free_port(),
                  env={"SYMBIOSIS_API_KEYS": api_keys(tenants)},
                  executor_args=("--policy", policy, "--threads", str(settings.threads)))
    stack.start()
    try:
        return summarize(asyncio.run(replay(stack.base_url, trace, tenants)))
    finally:
        stack.stop()


def policies(settings: Settings) -> tuple[list[Record], dict]:
    n, stretch = (8, 0.5) if settings.toy else (16, 3.0) if settings.quick else (120, 6.0)
    trace = load_trace(n, stretch, prompt_scale=16, output_scale=8)
    tenants = settings.n(TENANTS)
    # lockstep collapses (0.3x in every full run); --quick (and --toy) leave out its long replay
    short = settings.quick or settings.toy
    names = ("eager", "opportunistic") if short else ("eager", "lockstep", "opportunistic")
    with tempfile.TemporaryDirectory(prefix="symb-trace-") as scratch:
        adapters = tenant_adapters(Path(scratch), settings.model, tenants)
        summaries = {policy: replay_under(policy, Path(scratch) / policy, adapters, trace,
                                          settings) for policy in names}
    eager, opp = summaries["eager"], summaries["opportunistic"]
    records = [Record("5 batching policies (Azure trace)", "throughput, opportunistic vs eager",
                      opp["tokens_per_s"], eager["tokens_per_s"], "tok/s", ">= 1.25x",
                      note=f"{n} requests, {tenants} tenants, arrivals x{stretch:g}")]
    for key, label in (("ttft_p50_ms", "time to first token p50"),
                       ("ttft_p99_ms", "time to first token p99"),
                       ("token_p50_ms", "per-token latency p50"),
                       ("token_p99_ms", "per-token latency p99")):
        records.append(Record("5 batching policies (Azure trace)", f"{label}, opp. vs eager",
                              opp[key], eager[key], "ms", "<= 1.0x", higher_is_better=False))
    if "lockstep" in summaries:
        records.append(Record("5 batching policies (Azure trace)", "throughput, lockstep vs eager",
                              summaries["lockstep"]["tokens_per_s"], eager["tokens_per_s"],
                              "tok/s"))
    return records, summaries


def policy_records(settings: Settings) -> list[Record]:
    """Batching policies on a replay of the Azure trace, through the whole stack."""
    return policies(settings)[0]

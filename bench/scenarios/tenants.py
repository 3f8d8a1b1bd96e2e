"""Many tenants through the whole stack (14, issue 32): 100 tenants with 10 LoRA adapters each
(tiny-llama, r8), Zipf traffic over all 1,000 adapters as HTTP completions with one request to
every adapter mixed in (each of the 1,000 is served at least once), 8 in flight, served
by a shared pool of 2 workers (`--shared-workers 2 --shared-tenants '*'`) against one worker per
tenant, all of them allowed at once (`--max-workers` = the tenants). Per side: failed requests,
p95 latency, requests/s and the peak memory of the whole stack (PSS summed over its processes:
executor, manager, spawner, workers, gateway)."""

from __future__ import annotations

import asyncio
import random
import shutil
import tempfile
import time
from pathlib import Path

import httpx

from bench.measure import PeakPss, tree_pss
from bench.records import Record
from bench.scenarios.adapter_sides import MODEL, make_adapters
from bench.scenarios.adapters import p95, zipf
from bench.scenarios.common import Settings

TENANTS, PER_TENANT = 100, 10
SHARED_WORKERS = 2
IN_FLIGHT = 8
PROMPT = "A tenant asks one of its many adapters for a few words"


def register(data_dir: Path, paths: list[Path], tenants: int) -> list[str]:
    """Adapter k goes to tenant k % tenants (popular adapters spread over tenants); the model
    id of each."""
    from state.db import Database, db_path
    from workers.manager.adapter_store import AdapterRegistry
    from workers.manager.records import writing

    data_dir.mkdir(parents=True)
    with writing(data_dir):  # before the stack starts: as the data dir's writer
        registry = AdapterRegistry(Database(db_path(data_dir)), data_dir, MODEL)
        return [registry.register(f"t{k % tenants}", f"a{k}", path).model
                for k, path in enumerate(paths)]


async def traffic(base_url: str, models: list[str], order: list[int]) -> dict:
    latencies, failed, slots = [], 0, asyncio.Semaphore(IN_FLIGHT)

    async def ask(client: httpx.AsyncClient, model: str) -> None:
        nonlocal failed
        tenant = model.split("/")[0]
        async with slots:
            started = time.perf_counter()
            response = await client.post("/v1/completions", json={
                "model": model, "prompt": PROMPT, "max_tokens": 8, "temperature": 0,
                "ignore_eos": True}, headers={"Authorization": f"Bearer sk-{tenant}"})
            if response.status_code == 200:
                latencies.append(time.perf_counter() - started)
            else:
                failed += 1

    begin = time.perf_counter()
    async with httpx.AsyncClient(base_url=base_url, timeout=600) as client:
        await asyncio.gather(*(ask(client, models[k]) for k in order))
    return {"elapsed": time.perf_counter() - begin, "latencies": latencies, "failed": failed}


def many_tenants(settings: Settings) -> list[Record]:
    from launcher.ports import free_port
    from launcher.stack import Stack

    tenants, per = (4, 2) if settings.toy else (TENANTS, PER_TENANT)
    requests = 16 if settings.toy else 240 if settings.quick else 600
    keys = ",".join(f"t{i}=sk-t{i}" for i in range(tenants))
    root = Path(tempfile.mkdtemp(prefix="symb-tenants-"))
    sides = {"shared": ("--shared-workers", str(SHARED_WORKERS), "--shared-tenants", "*"),
             "own": ("--max-workers", str(tenants))}
    results, order = {}, []
    try:
        paths = make_adapters(root / "files", tenants * per)
        order = zipf(len(paths), requests, seed=3) + list(range(len(paths)))
        random.Random(3).shuffle(order)
        for side, manager_args in sides.items():
            models = register(root / side / "data", paths, tenants)
            stack = Stack(root / side / "data", MODEL, port=free_port(),
                          env={"SYMBIOSIS_API_KEYS": keys},
                          executor_args=("--threads", str(settings.threads)),
                          manager_args=manager_args).start()
            try:
                pids = [service.proc.pid for service in stack.services.values()]
                with PeakPss(lambda pids=pids: pids, every_s=0.25) as peak:
                    results[side] = asyncio.run(traffic(stack.base_url, models, order))
                # and once all workers are up (a short run may end between two samples)
                results[side]["pss"] = max(peak.peak, tree_pss(pids))
            finally:
                stack.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    shared, own = results["shared"], results["own"]
    name = "14 many tenants (whole stack)"
    what = f"{tenants * per} adapters over {tenants} tenants, {len(order)} requests"
    note = f"ours: {SHARED_WORKERS} shared workers; baseline: a worker per tenant"
    return [
        Record(name, f"{what}: failed requests, shared pool vs a worker per tenant",
               shared["failed"], own["failed"], "requests", "<= 0", higher_is_better=False,
               note=note),
        Record(name, f"{what}: peak memory of the whole stack", shared["pss"] / 2**30,
               own["pss"] / 2**30, "GiB", "<= 4 GiB", higher_is_better=False, note=note),
        Record(name, f"{what}: p95 latency", p95(shared["latencies"]), p95(own["latencies"]),
               "ms", higher_is_better=False, note=note),
        Record(name, f"{what}: requests/s", len(order) / shared["elapsed"],
               len(order) / own["elapsed"], "req/s", note=note),
    ]

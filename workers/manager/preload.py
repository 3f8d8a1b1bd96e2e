"""Pinned tenants' workers start with the manager, with their pinned adapters loaded, not on
their first request."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from state.adapters import AdapterReader
from state.db import Database, db_path
from wire import manager as W
from workers.manager.config import ManagerConfig
from workers.manager.pool import NoCapacity, WorkerHandle, WorkerPool

log = logging.getLogger("workers.preload")


def pinned_requests(config: ManagerConfig) -> list[W.Generate]:
    """For each pinned TENANT|MODEL that exists, the request a first client would send."""
    registry = None
    if config.data_dir:
        registry = AdapterReader(Database(db_path(Path(config.data_dir))),
                                 Path(config.data_dir), config.model)
    requests = []
    for key in sorted(config.pinned):
        tenant, _, model = key.partition("|")
        adapter = None
        if model != config.model:
            record = registry.visible(model, tenant) if registry is not None else None
            if record is None:
                log.warning("pinned %s: no such model for that tenant; not preloaded", key)
                continue
            adapter = W.AdapterRef(record.path, record.peft_type)
            model = f"{model}@{record.version}"  # the version serving the name now
        requests.append(W.Generate(f"preload-{key}", tenant, model,
                                   W.SamplingParams(max_tokens=0), adapter))
    return requests


def preload(config: ManagerConfig, pool: WorkerPool,
            start: Callable[[WorkerHandle], None]) -> None:
    """Start the worker of each pinned tenant, as far as the worker slots go, and have it load
    the pinned adapters (a request of no tokens each, whose answer nobody awaits)."""
    for request in pinned_requests(config):
        handle = pool.workers.get(pool.key_of(request.tenant))
        if handle is None:
            try:
                handle, _ = pool.add(request.tenant)
            except NoCapacity:
                log.warning("more pinned tenants than --max-workers: %s not preloaded",
                            request.model)
                continue
            log.info("preloading pinned worker %s", handle.key)
            start(handle)
        handle.models.add(request.model)
        handle.pending[request.id] = request  # sent once the worker is ready

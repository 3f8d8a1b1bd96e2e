"""Inference workers' share of the cores: a worker is spawned with the cores over the live
workers, and as workers start and stop the ready ones are told their new share; an operator's
count is never re-told. The manager in this process, its sockets and spawner replaced by
stand-ins that keep what it sends; its loop's `threads.tell()` after each round of messages is
called here by hand."""

from __future__ import annotations

import logging
import threading

import pytest

from tests.workers.manager.stand_ins import Links, Spawner
from wire import manager as W
from workers.manager.broker import Manager
from workers.manager.capacity import ThreadShare
from workers.manager.config import ManagerConfig


@pytest.fixture()
def manager():
    made: list[Manager] = []

    def make(worker_threads: int = 0, cores: int = 4) -> Manager:
        manager = Manager(ManagerConfig(executor="ipc:///nonexistent/executor.sock",
                                        worker_bind="ipc:///nonexistent/workers.sock",
                                        worker_threads=worker_threads), threading.Event())
        manager.links, manager.spawner = Links(), Spawner()
        manager.threads.share = ThreadShare(cores, worker_threads)  # this host's cores aside
        made.append(manager)
        return manager

    yield make
    for manager in made:
        manager.probes.close()
        manager.ctx.term()


def _request(manager: Manager, tenant: str) -> str:
    """A request of `tenant` and its worker's Ready: the worker's key."""
    manager._from_gateway(b"gateway", W.Generate(f"r-{tenant}", tenant, "tiny-llama",
                                                 W.SamplingParams()))
    manager.threads.tell()
    key = manager.spawner.specs[-1].key
    manager._from_worker(key.encode(), W.Ready(key, 1000 + len(manager.spawner.specs), 0.1))
    manager.threads.tell()
    return key


def _told(manager: Manager) -> list[tuple[str, int]]:
    told = [(key, m.threads) for key, m in manager.links.to_workers
            if isinstance(m, W.WorkerThreads)]
    manager.links.to_workers.clear()
    return told


def test_workers_share_the_cores_as_they_start_and_stop(manager, caplog) -> None:
    caplog.set_level(logging.INFO, "workers.manager")
    m = manager()
    acme = _request(m, "acme")
    assert m.spawner.specs[-1].threads == 4 and _told(m) == []  # alone: every core
    beta = _request(m, "beta")
    # spawned on half; told nothing before its Ready, nor after (it has its share)
    assert m.spawner.specs[-1].threads == 2 and _told(m) == [(acme, 2)]
    gamma = _request(m, "gamma")
    assert m.spawner.specs[-1].threads == 1 and _told(m) == [(acme, 1), (beta, 1)]
    m._stop(m.pool.workers[beta])  # stopping: no longer counted, and told nothing
    m.threads.tell()
    assert _told(m) == [(acme, 2), (gamma, 2)]
    m.threads.tell()  # nothing changed: nothing sent
    assert _told(m) == []
    assert {w.key: (w.state, w.threads) for w in m._status().workers} == {
        acme: ("ready", 2), beta: ("stopping", 1), gamma: ("ready", 2)}  # as /metrics shows
    assert [r.getMessage() for r in caplog.records if "worker(s) live" in r.getMessage()] == [
        f"{n} worker(s) live: each on {t} threads at most" for n, t in
        ((1, 4), (2, 2), (3, 1), (2, 2))]


def test_a_worker_started_meanwhile_is_told_at_its_ready(manager) -> None:
    m = manager()
    m._from_gateway(b"gateway", W.Generate("r-a", "acme", "tiny-llama", W.SamplingParams()))
    acme = m.spawner.specs[-1].key
    beta = _request(m, "beta")  # acme, spawned on 4, still starting
    assert _told(m) == []
    m._from_worker(acme.encode(), W.Ready(acme, 1234, 0.1))
    m.threads.tell()
    assert _told(m) == [(acme, 2)] and m.pool.workers[beta].threads == 2


def test_an_operators_count_is_every_workers_and_never_retold(manager) -> None:
    m = manager(worker_threads=3)
    for tenant in ("acme", "beta", "gamma"):
        _request(m, tenant)
    assert [spec.threads for spec in m.spawner.specs] == [3, 3, 3] and _told(m) == []

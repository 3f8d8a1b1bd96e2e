"""The manager stamps each `Generate` with when it reached the gateway (its own receipt less what
the gateway says it held it), so that a worker's time to first token (and the waits paced from
it) counts the gateway's handling and the wait for a worker too: the manager in this
process, its sockets and spawner replaced by stand-ins that keep what it sends."""

from __future__ import annotations

import threading
import time

from tests.workers.manager.stand_ins import Links, Spawner
from wire import manager as W
from workers.manager.broker import Manager
from workers.manager.config import ManagerConfig


def test_a_request_that_waited_for_its_worker_carries_when_the_gateway_received_it() -> None:
    manager = Manager(ManagerConfig(executor="ipc:///nonexistent/executor.sock",
                                    worker_bind="ipc:///nonexistent/workers.sock"),
                      threading.Event())
    manager.links, manager.spawner = Links(), Spawner()
    try:
        before = time.monotonic()
        manager._from_gateway(b"gateway", W.Generate("r-0", "acme", "tiny-llama",
                                                     W.SamplingParams(), waited_us=1_500_000))
        after = time.monotonic()
        assert len(manager.spawner.specs) == 1 and manager.links.to_workers == []  # starting
        time.sleep(0.2)  # the worker starts
        (key,) = manager.pool.workers
        manager._from_worker(key.encode(), W.Ready(key, 1234, 0.2))
        ((to, sent),) = manager.links.to_workers
        assert to == key and sent.id == "r-0"
        # the manager's receipt less the 1.5 s the gateway held it; not when it was sent on
        assert before - 1.5 <= sent.arrived <= after - 1.5
        assert manager.links.replies == []
    finally:
        manager.probes.close()
        manager.ctx.term()

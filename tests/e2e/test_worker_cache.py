"""The worker cache under a burst across more tenants than worker slots: a pinned tenant's worker
is started with the manager, requests wait for a slot instead of failing, and no worker is
evicted before its minimum residency. One tenant's adapters never compete for slots: its worker
serves them all."""

from __future__ import annotations

import re
import threading
import time

import pytest

from tests.e2e.conftest import MODEL, deploy
from tests.e2e.test_faults import manager_status

pytestmark = pytest.mark.slow
RESIDENCY_S = 2.0


def test_a_burst_waits_for_slots_and_never_evicts_a_young_worker(tmp_path) -> None:
    deployment = deploy(tmp_path, manager_args=(
        "--max-workers", "2", "--min-residency-s", str(RESIDENCY_S), "--pin", "beta|beta/ia3-b"))
    try:
        deadline = time.monotonic() + 30
        while not [w for w in manager_status(deployment).workers
                   if "beta/ia3-b@1" in w.models and w.state == "ready"]:
            assert time.monotonic() < deadline, "the pinned worker was not preloaded"
            time.sleep(0.2)
        # one free slot for two tenants (gamma may have 2 requests in flight)
        asks = [("acme", "acme/lora-a"), ("gamma", MODEL), ("acme", "acme/prefix-a")] * 2
        answers: list[int] = []
        started = time.monotonic()

        def ask(tenant: str, model: str) -> None:
            out = deployment.client(tenant).completions.create(model=model, prompt="Hi",
                                                               max_tokens=4)
            answers.append(out.usage.completion_tokens)

        threads = [threading.Thread(target=ask, args=a) for a in asks]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        elapsed = time.monotonic() - started
        assert answers == [4] * len(asks)  # nobody got a 503
        log = "".join(deployment.stack.services["manager"].log)
        ages = [float(a) for a in re.findall(r"evicting least recently used worker \S+ "
                                             r"\(age ([\d.]+) s\)", log)]
        assert ages and all(age >= RESIDENCY_S for age in ages), ages
        assert len(ages) <= elapsed / RESIDENCY_S + 1
        assert "worker beta " not in " ".join(re.findall(r"evicting .*", log))
    finally:
        deployment.stack.stop()

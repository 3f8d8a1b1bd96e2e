"""The worker cache under a burst across more adapters than worker slots: pinned workers are
started with the manager, requests wait for a slot instead of failing, and no worker is evicted
before its minimum residency."""

from __future__ import annotations

import re
import threading
import time

import pytest

from tests.e2e.conftest import deploy
from tests.e2e.test_faults import manager_status

pytestmark = pytest.mark.slow
RESIDENCY_S = 2.0


def test_a_burst_waits_for_slots_and_never_evicts_a_young_worker(tmp_path) -> None:
    deployment = deploy(tmp_path, manager_args=(
        "--max-workers", "2", "--min-residency-s", str(RESIDENCY_S), "--pin", "beta|beta/ia3-b"))
    try:
        deadline = time.monotonic() + 30
        while not [w for w in manager_status(deployment).workers
                   if w.model == "beta/ia3-b@1" and w.state == "ready"]:
            assert time.monotonic() < deadline, "the pinned worker was not preloaded"
            time.sleep(0.2)
        client = deployment.client("acme")
        models = ["acme/lora-a", "acme/prefix-a"] * 4  # one free slot for two adapters
        answers: list[int] = []
        started = time.monotonic()

        def ask(model: str) -> None:
            out = client.completions.create(model=model, prompt="Hi", max_tokens=4)
            answers.append(out.usage.completion_tokens)

        threads = [threading.Thread(target=ask, args=(m,)) for m in models]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        elapsed = time.monotonic() - started
        assert answers == [4] * len(models)  # nobody got a 503
        log = "".join(deployment.stack.services["manager"].log)
        ages = [float(a) for a in re.findall(r"evicting least recently used worker \S+ "
                                             r"\(age ([\d.]+) s\)", log)]
        assert ages and all(age >= RESIDENCY_S for age in ages), ages
        assert len(ages) <= elapsed / RESIDENCY_S + 1
        assert "beta|beta/ia3-b" not in " ".join(re.findall(r"evicting .*", log))
    finally:
        deployment.stack.stop()

"""The worker cache under a burst across more tenants than worker slots: a pinned tenant's worker
is started with the manager, requests wait for a slot instead of failing, and no worker is
evicted before its minimum residency. One tenant's adapters never compete for slots: its worker
serves them all. Tenants that share are served by the shared pool's workers."""

from __future__ import annotations

import re
import threading
import time

import pytest

from tests.e2e.adapters import save_adapter
from tests.e2e.conftest import MODEL, deploy, register
from tests.e2e.test_faults import manager_status
from wire.cores import host_cores

pytestmark = pytest.mark.slow
RESIDENCY_S = 2.0
PROMPT = "Tenants sharing a worker"


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
        # the live workers share the cores: the pinned one alone, then beside a second
        cores = host_cores()
        shares = [(int(n), int(t)) for n, t in re.findall(
            r"(\d+) worker\(s\) live: each on (\d+) threads at most", log)]
        assert shares[:2] == [(1, cores), (2, cores // 2)][:1 if cores == 1 else 2], shares
        assert all(t == max(1, cores // n) for n, t in shares)
        told = {int(t) for t in re.findall(r"forwards on (\d+) threads at most from now on",
                                           log)}
        assert (told == set()) if cores == 1 else (max(1, cores // 2) in told), told
    finally:
        deployment.stack.stop()


def test_tenants_that_share_are_served_by_one_worker_exactly(tmp_path) -> None:
    """The shared pool (operator choice): acme's and gamma's requests go to one shared worker,
    several tenants' adapters in its batches; beta, not sharing, keeps a worker of its own, its
    two IA3 adapters in one batch. Every answer equals plain peft's."""
    deployment = deploy(tmp_path, manager_args=("--shared-workers", "1",
                                                 "--shared-tenants", "acme,gamma"))
    try:
        second = save_adapter(tmp_path / "beta-ia3-c", "ia3", 5)
        register(deployment.stack.data_dir, "beta", "ia3-c", second)
        deployment.adapters["beta/ia3-c"] = second
        asks = [("acme", "acme/lora-a"), ("gamma", MODEL), ("acme", "acme/prefix-a"),
                ("beta", "beta/ia3-b"), ("beta", "beta/ia3-c")] * 2
        answers: dict[int, str] = {}

        def ask(k: int, tenant: str, model: str) -> None:
            out = deployment.client(tenant).completions.create(model=model, prompt=PROMPT,
                                                               max_tokens=6, temperature=0)
            answers[k] = out.choices[0].text

        threads = [threading.Thread(target=ask, args=(k, *a)) for k, a in enumerate(asks)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        for k, (_, model) in enumerate(asks):
            reference = deployment.reference(model)
            assert answers[k] == reference.text(reference.greedy(reference.ids(PROMPT), 6)), model
        workers = {w.key: w for w in manager_status(deployment).workers}
        assert sorted(workers) == ["beta", "~shared-0"]
        assert {"acme/lora-a@1", "acme/prefix-a@1", MODEL} <= set(workers["~shared-0"].models)
        assert {"beta/ia3-b@1", "beta/ia3-c@1"} <= set(workers["beta"].models)
    finally:
        deployment.stack.stop()

"""The circuit breaker on a real stack: a model that keeps failing is refused at once (or served
by the base model for a tenant that allows fallback), and a probe after the cool-down closes the
circuit again once the model works."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import time

import openai
import pytest

from tests.e2e.adapters import save_adapter
from tests.e2e.conftest import _record_path, deploy, register
from tests.e2e.test_faults import manager_status, worker_pid

pytestmark = pytest.mark.slow
COOLDOWN_S = 2.0


@pytest.fixture()
def deployment(tmp_path):
    deployment = deploy(tmp_path, manager_args=("--breaker-failures", "3",
                                                "--breaker-cooldown-s", str(COOLDOWN_S)))
    yield deployment
    deployment.stack.stop()


def status_of(client: openai.OpenAI, model: str) -> tuple[int, str]:
    try:
        client.completions.create(model=model, prompt="Hi", max_tokens=2)
    except openai.APIStatusError as exc:
        return exc.status_code, exc.body["code"]
    return 200, "ok"


def test_a_failing_adapter_trips_the_breaker_and_a_probe_closes_it(deployment,
                                                                   tmp_path) -> None:
    data_dir = deployment.stack.data_dir
    good = save_adapter(tmp_path / "good", "lora", 5)
    register(data_dir, "acme", "flaky", good)
    stored = _record_path(data_dir, "acme/flaky")
    weights = f"{stored}/adapter_model.safetensors"
    shutil.copy(weights, tmp_path / "weights.bak")
    with open(weights, "wb") as broken:
        broken.write(b"\x08\x00\x00\x00\x00\x00\x00\x00{garbage")
    client = deployment.client("acme")
    assert [status_of(client, "acme/flaky") for _ in range(3)] == \
        [(503, "adapter_load_failed")] * 3
    starts = manager_status(deployment).counters["worker_starts"]
    assert status_of(client, "acme/flaky") == (503, "circuit_open")
    assert manager_status(deployment).counters["worker_starts"] == starts  # refused at once
    time.sleep(COOLDOWN_S)
    assert status_of(client, "acme/flaky") == (503, "adapter_load_failed")  # the probe failed
    assert status_of(client, "acme/flaky") == (503, "circuit_open")
    shutil.copy(tmp_path / "weights.bak", weights)  # repaired
    time.sleep(COOLDOWN_S)
    assert status_of(client, "acme/flaky") == (200, "ok")  # the probe closes the circuit
    assert [status_of(client, "acme/flaky") for _ in range(2)] == [(200, "ok")] * 2


def crash_mid_stream(deployment, client: openai.OpenAI, model: str) -> None:
    """A worker that dies while it streams: a failure of `model`, with no success since."""
    stream = client.completions.create(model=model, prompt="Hi", max_tokens=1900, stream=True,
                                       extra_body={"ignore_eos": True})
    chunks = iter(stream)
    next(chunks)
    os.kill(worker_pid(deployment, "gamma", model), signal.SIGKILL)
    with contextlib.suppress(openai.APIError):
        for _ in chunks:
            pass
    deadline = time.monotonic() + 10
    while any(f"{model}@1" in w.models for w in manager_status(deployment).workers):
        assert time.monotonic() < deadline
        time.sleep(0.1)


def test_an_open_circuit_serves_a_fallback_tenant_from_the_base_model(deployment,
                                                                      tmp_path) -> None:
    data_dir = deployment.stack.data_dir
    register(data_dir, "gamma", "crashy", save_adapter(tmp_path / "crashy", "lora", 6))
    client = deployment.client("gamma")
    for _ in range(3):
        crash_mid_stream(deployment, client, "gamma/crashy")
    raw = client.completions.with_raw_response.create(model="gamma/crashy", prompt="Hi",
                                                      max_tokens=2)
    assert raw.headers.get("x-symbiosis-fallback") == "base-model"
    assert raw.parse().usage.completion_tokens == 2
    assert not any("gamma/crashy@1" in w.models for w in manager_status(deployment).workers)

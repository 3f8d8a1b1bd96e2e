"""Faults: a tenant's worker killed mid-stream; the executor going down."""

from __future__ import annotations

import os
import signal
import threading
import time

import openai
import pytest
import zmq

from tests.e2e.adapters import MODEL
from tests.e2e.conftest import Deployment, deploy
from wire import manager as W

pytestmark = pytest.mark.slow


def manager_status(deployment: Deployment) -> W.StatusReply:
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(deployment.stack.service_env()["SYMBIOSIS_MANAGER"])
    try:
        sock.send(W.encode(W.Status()))
        assert sock.poll(5000), "the manager did not answer"
        return W.decode(sock.recv())
    finally:
        sock.close()
        ctx.term()


def worker_pid(deployment: Deployment, tenant: str, model: str) -> int:
    """The pid of the tenant's worker, serving the only version (@1) of `model`."""
    for worker in manager_status(deployment).workers:
        if worker.tenant == tenant and f"{model}@1" in worker.models and worker.state == "ready":
            return worker.pid
    raise AssertionError(f"no ready worker for {tenant} {model}")


def test_killed_worker_fails_only_its_own_stream(deployment: Deployment) -> None:
    acme, beta = deployment.client("acme"), deployment.client("beta")
    acme.completions.create(model="acme/lora-a", prompt="warm", max_tokens=1)  # workers up
    beta.completions.create(model="beta/ia3-b", prompt="warm", max_tokens=1)
    crashes_before = manager_status(deployment).counters.get("worker_crashes", 0)
    victim = worker_pid(deployment, "acme", "acme/lora-a")
    outcome: dict[str, object] = {}
    streaming = threading.Event()

    def doomed() -> None:
        received = 0
        try:
            for chunk in acme.completions.create(model="acme/lora-a", prompt="Once", stream=True,
                                                 max_tokens=400, temperature=0,
                                                 extra_body={"ignore_eos": True}):
                received += len(chunk.choices)
                if received >= 3:
                    streaming.set()
            outcome["acme"] = "completed"
        except openai.APIError as exc:
            outcome["acme"] = exc
        outcome["acme_chunks"] = received

    def bystander() -> None:
        chunks = list(beta.completions.create(model="beta/ia3-b", prompt="Twice", stream=True,
                                              max_tokens=60, temperature=0,
                                              extra_body={"ignore_eos": True}))
        outcome["beta"] = (chunks[-1].choices[0].finish_reason,
                           sum(1 for c in chunks for _ in c.choices))

    threads = [threading.Thread(target=doomed), threading.Thread(target=bystander)]
    for thread in threads:
        thread.start()
    assert streaming.wait(60), "the stream to interrupt never started"
    os.kill(victim, signal.SIGKILL)
    for thread in threads:
        thread.join(120)
    assert isinstance(outcome["acme"], openai.APIError), outcome
    assert 3 <= outcome["acme_chunks"] < 400
    assert outcome["beta"] == ("length", 60)
    again = acme.completions.create(model="acme/lora-a", prompt="Again", max_tokens=4,
                                    temperature=0)
    assert again.usage.completion_tokens == 4
    assert worker_pid(deployment, "acme", "acme/lora-a") != victim
    assert manager_status(deployment).counters["worker_crashes"] == crashes_before + 1


def test_a_request_right_after_a_worker_died_goes_to_a_new_worker(
        deployment: Deployment) -> None:
    beta = deployment.client("beta")
    expected = beta.completions.create(model="beta/ia3-b", prompt="Hello", max_tokens=5,
                                       temperature=0).choices[0].text
    victim = worker_pid(deployment, "beta", "beta/ia3-b")
    os.kill(victim, signal.SIGKILL)  # the manager has not noticed yet when the request comes
    again = beta.completions.create(model="beta/ia3-b", prompt="Hello", max_tokens=5,
                                    temperature=0)
    assert again.choices[0].text == expected
    assert worker_pid(deployment, "beta", "beta/ia3-b") != victim


def test_a_non_streaming_request_stops_when_its_client_leaves(deployment: Deployment) -> None:
    acme = deployment.client("acme")
    acme.completions.create(model="acme/lora-a", prompt="warm", max_tokens=1)
    impatient = deployment.client("acme", timeout=1.0)
    with pytest.raises(openai.APITimeoutError):  # the client hangs up after 1 s
        impatient.completions.create(model="acme/lora-a", prompt="Long", max_tokens=1900,
                                     extra_body={"ignore_eos": True})
    left = time.monotonic()
    while True:
        busy = [w for w in manager_status(deployment).workers if "acme/lora-a@1" in w.models]
        if busy and busy[0].inflight == 0:
            break
        assert time.monotonic() - left < 5, "the worker is still generating for nobody"
        time.sleep(0.2)


def test_executor_down_is_503_and_not_ready(tmp_path) -> None:
    deployment = deploy(tmp_path)
    try:
        client = deployment.client("acme")
        assert client.completions.create(model=MODEL, prompt="hi", max_tokens=2).choices
        deployment.stack.kill("executor")
        with pytest.raises(openai.APIStatusError) as info:
            client.completions.create(model="acme/lora-a", prompt="hi", max_tokens=2)
        assert info.value.status_code == 503
        with pytest.raises(openai.APIStatusError) as info:
            client.completions.create(model=MODEL, prompt="hi", max_tokens=2)
        assert info.value.status_code == 503
        deadline = time.monotonic() + 15
        import httpx

        while time.monotonic() < deadline:
            ready = httpx.get(f"{deployment.stack.base_url}/ready")
            if ready.status_code == 503:
                break
            time.sleep(0.5)
        assert ready.status_code == 503 and ready.json()["checks"]["executor"] is False
    finally:
        deployment.stack.stop()

"""Faults: a tenant's worker killed mid-stream (a completion's, a response's); the executor
going down."""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import httpx
import openai
import pytest
import zmq

from tests.e2e.adapters import MODEL, save_adapter
from tests.e2e.conftest import KEYS, Deployment, deploy, register
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


def sse_events(response: httpx.Response, victim: int) -> list[tuple[str, dict]]:
    """A Responses stream's (event name, data) pairs, `victim` killed once its text has
    begun (the sixth event)."""
    events, name = [], ""
    for line in response.iter_lines():
        if line.startswith("event: "):
            name = line.removeprefix("event: ")
        elif line.startswith("data: "):
            events.append((name, json.loads(line.removeprefix("data: "))))
            if len(events) == 6:
                os.kill(victim, signal.SIGKILL)
    return events


SEVERED = "acme/severed"


def test_a_broken_off_response_stream_ends_failed_and_is_kept_so(deployment: Deployment,
                                                                   tmp_path) -> None:
    register(deployment.stack.data_dir, "acme", "severed",
             save_adapter(tmp_path / "severed", "lora", 7))
    client = deployment.client("acme")
    ask = {"model": SEVERED, "input": "Once", "max_output_tokens": 400, "temperature": 0}
    client.responses.create(**ask | {"max_output_tokens": 1})  # its worker up
    with httpx.stream("POST", f"{deployment.stack.base_url}/v1/responses", timeout=120,
                      json={**ask, "stream": True},
                      headers={"Authorization": f"Bearer {KEYS['acme']}"}) as raw:
        events = sse_events(raw, worker_pid(deployment, "acme", SEVERED))
    assert [name for name, _ in events[-2:]] == ["error", "response.failed"]
    assert all(name == data["type"] for name, data in events)
    error, failed = events[-2][1], events[-1][1]["response"]
    assert error["code"] == "worker_unavailable" == error["error"]["code"] and \
        failed["error"] == {"code": "server_error", "message": error["message"]}
    assert failed["status"] == "failed" and failed["output"][0]["status"] == "incomplete"
    text = "".join(data["delta"] for name, data in events
                   if name == "response.output_text.delta")
    assert text and failed["output"][0]["content"][0]["text"] == text
    kept = client.responses.retrieve(failed["id"])  # kept as it failed
    assert kept.status == "failed" and kept.model_dump() == \
        openai.types.responses.Response.model_validate(failed).model_dump()
    assert client.responses.create(**ask | {"max_output_tokens": 2}).status == "incomplete"
    stream = iter(client.responses.create(**ask, stream=True))
    started = [next(stream) for _ in range(5)]
    os.kill(worker_pid(deployment, "acme", SEVERED), signal.SIGKILL)
    with pytest.raises(openai.APIError) as raised:  # the official SDK raises on `error`
        started += list(stream)
    assert raised.value.code == "worker_unavailable" and \
        raised.value.message == error["message"]


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
    """Every one of its prompts (aborted together, in one message through the manager)."""
    acme = deployment.client("acme")
    acme.completions.create(model="acme/lora-a", prompt="warm", max_tokens=1)
    impatient = deployment.client("acme", timeout=1.0)
    with pytest.raises(openai.APITimeoutError):  # the client hangs up after 1 s
        impatient.completions.create(model="acme/lora-a", prompt=["Long", "Longer", "Longest"],
                                     max_tokens=1900, extra_body={"ignore_eos": True})
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

"""The gateway with an in-process stand-in for the worker manager (a ROUTER socket)."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
import zmq
import zmq.asyncio

from gateway.app import create_app
from gateway.serving import Target
from gateway.settings import GatewaySettings
from wire import manager as W
from wire.call import messages as P


class StandInManager:
    """Answers Status; streams Deltas for every Generate until it is aborted (never finishing
    it), as fast as it can, so the gateway's queues are never empty; records the Aborts. Where
    it `starts` none, it takes every Generate and answers nothing (as a worker still embedding
    a request's inputs, or prefilling a long prompt, would not yet)."""

    def __init__(self, starts: bool = True) -> None:
        self.starts = starts
        self.ctx = zmq.asyncio.Context()
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        port = self.sock.bind_to_random_port("tcp://127.0.0.1")
        self.endpoint = f"tcp://127.0.0.1:{port}"
        self.aborted: list[list[str]] = []  # each Abort's ids
        self.generates: list[W.Generate] = []
        self.streaming: dict[str, asyncio.Task] = {}

    async def serve(self) -> None:
        while True:
            peer, data = await self.sock.recv_multipart()
            for message in W.unframed(W.decode(data)):  # a request's prompts come as one
                if isinstance(message, W.Status):
                    await self._send(peer, W.StatusReply([], True, {}))
                elif isinstance(message, W.Generate):
                    self.generates.append(message)
                    if self.starts:
                        await self._send(peer, W.Started(message.id, 1, False))
                        self.streaming[message.id] = asyncio.create_task(
                            self._stream(peer, message.id))
                elif isinstance(message, W.Abort):
                    self.aborted.append(message.ids)
                    for request_id in message.ids if self.starts else ():
                        self.streaming.pop(request_id).cancel()

    async def _stream(self, peer: bytes, request_id: str) -> None:
        while True:
            await self._send(peer, W.Delta(request_id, 0, "x"))
            await asyncio.sleep(0)

    async def _send(self, peer: bytes, message) -> None:
        await self.sock.send_multipart([peer, W.encode(message)])

    def close(self) -> None:
        self.sock.close(0)
        self.ctx.term()


def _scope(app, body: bytes) -> dict:
    """A POST /v1/completions of `body` by tenant acme, as the server hands it to the app."""
    return {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
            "method": "POST", "scheme": "http", "path": "/v1/completions", "raw_path": b"",
            "query_string": b"", "root_path": "", "app": app,
            "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 80),
            "headers": [(b"authorization", b"Bearer sk-acme"),
                        (b"content-type", b"application/json"),
                        (b"content-length", str(len(body)).encode())]}


async def _client_leaves(data_dir, manager: StandInManager | None = None, body_after_s: float = 0
                         ) -> tuple[list[dict], list[list[str]]]:
    """POST a completion through the whole app, its body sent `body_after_s` after its headers;
    the client leaves 0.2 s after sending it."""
    manager = manager or StandInManager()
    server = asyncio.create_task(manager.serve())
    app = create_app(GatewaySettings(data_dir=data_dir, api_keys="acme=sk-acme",
                                     manager=manager.endpoint))
    body = json.dumps({"model": "tiny-llama", "prompt": "long", "max_tokens": 100}).encode()
    incoming = [{"type": "http.request", "body": body, "more_body": False}]
    sent: list[dict] = []

    async def receive() -> dict:
        if incoming:
            await asyncio.sleep(body_after_s)
            return incoming.pop(0)
        await asyncio.sleep(0.2)
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        sent.append(message)

    scope = _scope(app, body)
    try:
        async with app.router.lifespan_context(app):
            for _ in range(1000):  # the gateway's first status exchange
                if app.state.manager.up:
                    break
                await asyncio.sleep(0.01)
            assert app.state.manager.up, "the gateway never saw the stand-in manager"
            await app(scope, receive, send)
            for _ in range(100):  # an abort sent from a clean-up task may come a little later
                if manager.aborted:
                    break
                await asyncio.sleep(0.01)
            return sent, manager.aborted
    finally:
        for task in [server, *manager.streaming.values()]:
            task.cancel()
        manager.close()


def test_a_request_whose_client_left_is_aborted_at_the_manager(tmp_path) -> None:
    sent, aborted = asyncio.run(_client_leaves(tmp_path))
    assert sent[0]["status"] == 499
    assert len(aborted) == 1 and len(aborted[0]) == 1 and aborted[0][0].endswith("-0")


def test_a_client_that_leaves_before_its_prompts_start_has_them_aborted(tmp_path) -> None:
    manager = StandInManager(starts=False)
    sent, aborted = asyncio.run(_client_leaves(tmp_path, manager))
    assert sent[0]["status"] == 499
    assert aborted == [[g.id for g in manager.generates]] and len(aborted[0]) == 1


@pytest.mark.parametrize("asked", [{}, {"decode_target_ms": 0.25, "prefill_target_ms": 30,
                                        "ttft_target_ms": 900, "inter_token_target_ms": 45}],
                         ids=["none", "tight"])
def test_a_request_carries_its_tenants_latency_targets_to_the_manager(tmp_path, asked) -> None:
    (tmp_path / "tenants.json").write_text(json.dumps({"tenants": [{"id": "acme", **asked}]}))
    manager = StandInManager()
    asyncio.run(_client_leaves(tmp_path, manager))
    expected = P.CallTargets(250, 30_000) if asked else P.NO_TARGETS
    assert [g.targets for g in manager.generates] == [expected]
    end_to_end = W.TokenTargets(900_000, 45_000) if asked else W.NO_TOKEN_TARGETS
    assert [g.token_targets for g in manager.generates] == [end_to_end]


def test_a_late_body_is_the_clients_time_not_counted_in_what_the_gateway_held(tmp_path) -> None:
    """The worker's time to first token counts from the gateway's receipt of the whole request
    (`waited_us`: how long the gateway held it since); a body sent 2 s after its headers is
    the client's time."""
    manager = StandInManager()
    asyncio.run(_client_leaves(tmp_path, manager, body_after_s=2.0))
    (generate,) = manager.generates
    assert 0 < generate.waited_us < 500_000


def started(data_dir, manager: StandInManager, *runs: tuple[str, int, float]
            ) -> list[W.Generate]:
    """The Generates the manager got for runs started (and closed) one after another, each
    (request id, prompts, seconds since it was received)."""

    async def start() -> list[W.Generate]:
        server = asyncio.create_task(manager.serve())
        app = create_app(GatewaySettings(data_dir=data_dir, api_keys="acme=sk-acme",
                                         manager=manager.endpoint))
        try:
            async with app.router.lifespan_context(app):
                while not app.state.manager.up:
                    await asyncio.sleep(0.01)
                for request_id, prompts, received_s_ago in runs:
                    run = await app.state.serving.start(
                        app.state.tenants.get("acme"), Target("tiny-llama", None), request_id,
                        [{"prompt": "Hi"}] * prompts, W.SamplingParams(),
                        received=time.monotonic() - received_s_ago)
                    await run.close()
                return manager.generates
        finally:
            for task in [server, *manager.streaming.values()]:
                task.cancel()
            manager.close()

    return asyncio.run(start())


def test_the_time_since_a_request_was_received_goes_with_it(tmp_path) -> None:
    (generate,) = started(tmp_path, StandInManager(), ("held", 1, 2.0))
    assert 2_000_000 <= generate.waited_us < 2_500_000


def test_requests_of_one_id_go_out_under_ids_of_their_own_their_prompts_grouped(tmp_path
                                                                                 ) -> None:
    """Replies are routed by a prompt's id: a client's `x-request-id` only leads it; a request's
    prompts share a `group` (its tenant's place in a worker's turns goes round its requests)."""
    sent = started(tmp_path, StandInManager(), ("same", 2, 0), ("same", 1, 0), ("x" * 500, 1, 0))
    assert len({g.id for g in sent}) == 4 and len({g.group for g in sent}) == 3
    assert [g.id for g in sent] == [f"{sent[0].group}-0", f"{sent[0].group}-1",
                                    f"{sent[2].group}-0", f"{sent[3].group}-0"]
    assert [g.group.split(".")[0] for g in sent] == ["same", "same", "same", "x" * 64]


def test_a_request_past_the_tenants_concurrency_is_429_with_retry_after(tmp_path) -> None:
    """While a tenant's one allowed request streams, the next is refused at once, and told when
    to retry (the SDK's retries wait for it); the refusal is counted."""
    manager = StandInManager()

    async def second_while_first_streams() -> tuple[list[dict], float]:
        server = asyncio.create_task(manager.serve())
        app = create_app(GatewaySettings(data_dir=tmp_path, api_keys="acme=sk-acme",
                                         manager=manager.endpoint, max_concurrent=1))
        body = json.dumps({"model": "tiny-llama", "prompt": "x", "stream": True}).encode()
        leave = asyncio.Event()

        async def first_receive() -> dict:
            if not leave.is_set() and not manager.generates:
                return {"type": "http.request", "body": body, "more_body": False}
            await leave.wait()
            return {"type": "http.disconnect"}

        sent: list[dict] = []

        async def nothing(_: dict) -> None:
            pass

        async def record(message: dict) -> None:
            sent.append(message)

        try:
            async with app.router.lifespan_context(app):
                while not app.state.manager.up:
                    await asyncio.sleep(0.01)
                first = asyncio.create_task(app(_scope(app, body), first_receive, nothing))
                while not manager.generates:
                    await asyncio.sleep(0.01)
                await app(_scope(app, body), lambda: asyncio.sleep(0, {
                    "type": "http.request", "body": body, "more_body": False}), record)
                leave.set()
                await first
                return sent, app.state.metrics.rejected.labels("acme", "concurrency")._value.get()
        finally:
            for task in [server, *manager.streaming.values()]:
                task.cancel()
            manager.close()

    sent, rejected = asyncio.run(second_while_first_streams())
    start = sent[0]
    assert start["status"] == 429 and (b"retry-after", b"1") in start["headers"]
    error = json.loads(b"".join(m.get("body", b"") for m in sent[1:]))["error"]
    assert error["code"] == "rate_limit_exceeded" and "limit 1" in error["message"]
    assert rejected == 1 and len(manager.generates) == 1

"""The gateway's connection to the worker manager against a real ROUTER socket in a thread that
answers at once: every reply reaches its request, in order, however the replies and the sends
interleave (a reply that arrives during a send must still wake the reader), and a request's
prompts leave as one frame."""

from __future__ import annotations

import asyncio
import threading

import pytest
import zmq

from gateway.manager_client import DRAIN, ManagerClient
from wire import manager as W


class EchoManager:
    """Answers Status, and each Generate with Started, `max_tokens` Deltas (their text the
    token's number) and Done, as soon as it reads it, in frames of up to `FRAME` replies (the
    manager passes a worker's on so); records every message's kind in order, and how many
    each frame it read carried."""

    FRAME = 7

    def __init__(self) -> None:
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.SNDHWM, 0)
        self.endpoint = f"tcp://127.0.0.1:{self.sock.bind_to_random_port('tcp://127.0.0.1')}"
        self.received: list[tuple[str, str | list[str]]] = []
        self.frames: list[int] = []
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self.stopping.is_set():
            if not self.sock.poll(50):
                continue
            peer, data = self.sock.recv_multipart()
            messages, replies = W.unframed(W.decode(data)), []
            self.frames.append(len(messages))
            for message in messages:
                self.received.append((type(message).__name__,
                                      getattr(message, "id", getattr(message, "ids", ""))))
                if isinstance(message, W.Status):
                    self._send(peer, W.StatusReply([], True, {}))
                elif isinstance(message, W.Generate):
                    tokens = message.params.max_tokens or 0
                    replies += [W.Started(message.id, 1),
                                *(W.Delta(message.id, 0, str(t)) for t in range(tokens)),
                                W.Done(message.id, 1, tokens)]
            for first in range(0, len(replies), self.FRAME):
                self._send(peer, W.framed(replies[first:first + self.FRAME]))

    def _send(self, peer: bytes, message) -> None:
        self.sock.send_multipart([peer, W.encode(message)])

    def close(self) -> None:
        self.stopping.set()
        self.thread.join()
        self.sock.close(0)
        self.ctx.term()


@pytest.fixture
def manager():
    stand_in = EchoManager()
    yield stand_in
    stand_in.close()


def generate(request_id: str, tokens: int) -> W.Generate:
    return W.Generate(request_id, "acme", "m", W.SamplingParams(max_tokens=tokens), prompt="x")


async def events_of(client: ManagerClient, requests: list[W.Generate]
                    ) -> dict[str, list[W.Message]]:
    """Each request's replies, all sent at once and answered through one inbox."""
    inbox = client.open(requests)
    events: dict[str, list[W.Message]] = {request.id: [] for request in requests}
    waiting = len(requests)
    while waiting:
        event = await client.next(inbox, 30)
        assert event is not None
        events[event.id].append(event)
        if isinstance(event, (W.Done, W.Failed)):
            client.forget(event.id)
            waiting -= 1
    return events


async def connected(manager: EchoManager) -> ManagerClient:
    """A client whose heartbeat (a send, which wakes the reader where replies wait) comes too
    seldom to hide a reader that missed its wake-up."""
    client = ManagerClient(manager.endpoint, heartbeat_s=60)
    await client.start()
    assert await client.fresh_status(5.0) is not None
    return client


def test_every_reply_of_many_requests_sent_at_once_arrives(manager):
    """Rounds of 512 requests sent together (four API requests' inputs, each request's into one
    inbox): each gets its Started, its Deltas in order and its Done, in its request's inbox
    only (a reader that missed the wake-up of replies that came during a send stalled a round,
    here until the round's timeout)."""

    async def run() -> None:
        client = await connected(manager)
        try:
            for round_ in range(12):
                groups = [[generate(f"r{round_}-{g}-{i}", i % 3) for i in range(128)]
                          for g in range(4)]
                async with asyncio.timeout(20):
                    answers = await asyncio.gather(*(events_of(client, g) for g in groups))
                for group, answer in zip(groups, answers, strict=True):
                    assert set(answer) == {request.id for request in group}
                    for request in group:
                        tokens, events = request.params.max_tokens, answer[request.id]
                        assert [type(e).__name__ for e in events] == \
                            ["Started"] + ["Delta"] * tokens + ["Done"]
                        assert [e.text for e in events[1:-1]] == [str(t) for t in range(tokens)]
            assert client.up and not client._inboxes
        finally:
            await client.close()

    asyncio.run(run())


def test_a_burst_longer_than_a_drain_arrives_whole_and_lets_others_run(manager):
    """One request's 5 x `DRAIN` Deltas come in order, and a task of the same loop gets turns
    while they are routed."""

    async def run() -> None:
        client = await connected(manager)
        turns = 0

        async def other() -> None:
            nonlocal turns
            while True:
                turns += 1
                await asyncio.sleep(0)

        ticking = asyncio.create_task(other())
        try:
            async with asyncio.timeout(20):
                events = (await events_of(client, [generate("long", 5 * DRAIN)]))["long"]
        finally:
            ticking.cancel()
            await client.close()
        assert [e.text for e in events[1:-1]] == [str(t) for t in range(5 * DRAIN)]
        assert isinstance(events[-1], W.Done)
        assert turns >= 5

    asyncio.run(run())


def test_messages_leave_in_the_order_sent(manager):
    """A request's Generate before its Abort, and a batch of sends in the order made."""

    async def run() -> None:
        client = await connected(manager)
        try:
            inbox = client.open([generate("first", 1000)])
            assert isinstance(await client.next(inbox, 30), W.Started)
            await client.abort(["first"])  # the consumer stops early
            for i in range(100):
                await client.send(W.Abort([f"a{i}"]))
            await client.fresh_status(5.0)
        finally:
            await client.close()
        kinds = [entry for entry in manager.received if entry[0] != "Status"]
        assert kinds == [("Generate", "first"), ("Abort", ["first"])] + \
            [("Abort", [f"a{i}"]) for i in range(100)]

    asyncio.run(run())


def test_a_requests_prompts_leave_as_one_frame(manager):
    async def run() -> None:
        client = await connected(manager)
        try:
            events = await events_of(client, [generate(f"p{i}", 2) for i in range(3)])
        finally:
            await client.close()
        assert [kind for kind in manager.received if kind[0] != "Status"] == \
            [("Generate", f"p{i}") for i in range(3)]
        assert 3 in manager.frames  # the three in one
        assert all(len(events[f"p{i}"]) == 4 for i in range(3))

    asyncio.run(run())


def test_a_wait_ends_empty_at_its_timeout_and_a_reply_already_come_is_returned_after_it(
        manager):
    async def run() -> None:
        client = await connected(manager)
        try:
            quiet = client.open([])
            started = asyncio.get_running_loop().time()
            assert await client.next(quiet, 0.2) is None
            assert asyncio.get_running_loop().time() - started >= 0.19
            inbox = client.open([generate("one", 0)])
            async with asyncio.timeout(10):
                while len(inbox) < 2:  # Started and Done came
                    await asyncio.sleep(0.01)
            assert isinstance(await client.next(inbox, 0), W.Started)
            assert isinstance(await client.next(inbox, -1), W.Done)
        finally:
            await client.close()

    asyncio.run(run())

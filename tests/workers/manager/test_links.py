"""The manager's sockets lose nothing however much comes at once: 5,000 messages sent to a
worker that reads none yet (as to one still starting), and to a gateway, all arrive, in order
(past ZeroMQ's default high-water mark, 1,000 a pipe, a ROUTER drops them silently). Requests
to a worker and replies to a gateway are held and go as one frame a peer, at `flush`, before
the next other message to that peer, or before a message that is neither a request nor a reply
is handled, in their order; a gateway's replies at most `SHARE` a frame."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import zmq

from wire import manager as W
from workers.manager.links import SHARE, Links

COUNT = 5000


def received(sock: zmq.Socket) -> list[str]:
    ids = []
    while sock.poll(500):
        ids.extend(W.decode(sock.recv()).ids)
    return ids


@dataclass
class Peers:
    links: Links
    worker: zmq.Socket  # worker "acme"'s socket
    gateway: zmq.Socket
    identity: bytes  # the gateway's, as the manager knows it


@contextlib.contextmanager
def connected(tmp_path: Path) -> Iterator[Peers]:
    """The manager's links, with a worker and a gateway connected both ways."""
    ctx = zmq.Context()
    links = Links(ctx, f"ipc://{tmp_path}/front.sock", f"ipc://{tmp_path}/back.sock")
    worker, gateway = ctx.socket(zmq.DEALER), ctx.socket(zmq.DEALER)
    try:
        worker.setsockopt(zmq.IDENTITY, b"acme")
        worker.connect(f"ipc://{tmp_path}/back.sock")
        gateway.connect(f"ipc://{tmp_path}/front.sock")
        gateway.send(W.encode(W.Status()))  # the manager learns the gateway's identity
        identity, _ = links.front.recv_multipart()
        worker.send(W.encode(W.Ready("acme", 1, 0.0)))
        links.back.recv_multipart()
        yield Peers(links, worker, gateway, identity)
    finally:
        for sock in (worker, gateway):
            sock.close(0)
        links.close()
        ctx.term()


def test_every_message_reaches_a_worker_and_a_gateway_that_read_late(tmp_path) -> None:
    with connected(tmp_path) as peers:
        for k in range(COUNT):
            peers.links.to_worker("acme", W.Abort([f"r-{k}"]))
            peers.links.reply(peers.identity, W.Abort([f"r-{k}"]))
        want = [f"r-{k}" for k in range(COUNT)]
        assert received(peers.worker) == want
        assert received(peers.gateway) == want


def frames(sock: zmq.Socket) -> list[W.Message]:
    got = []
    while sock.poll(500):
        got.append(W.decode(sock.recv()))
    return got


def asked(request_id: str) -> W.Generate:
    return W.Generate(request_id, "acme", "tiny-llama", W.SamplingParams(max_tokens=1))


def test_requests_and_replies_go_as_one_frame_a_peer_in_their_order(tmp_path) -> None:
    with connected(tmp_path) as peers:
        links, identity = peers.links, peers.identity
        links.to_worker("acme", asked("a"))
        links.to_worker("acme", asked("b"))
        links.to_worker("acme", W.Abort(["a"]))  # the held requests go first
        links.to_worker("acme", asked("c"))
        replies = [W.Started("a", 3), W.Delta("a", 0, "x"), W.Done("a", 3, 1)]
        for reply in replies:
            links.reply(identity, reply)
        links.reply(identity, W.StatusReply([], True, {}))
        many = [W.Delta("b", 0, str(k)) for k in range(SHARE + 1)]
        for reply in many:
            links.reply(identity, reply)  # a full share goes at once
        assert frames(peers.worker) == [W.Generates([asked("a"), asked("b")]), W.Abort(["a"])]
        assert frames(peers.gateway) == [W.Replies(replies), W.StatusReply([], True, {}),
                                         W.Replies(many[:SHARE])]
        links.flush()
        assert frames(peers.worker) == [asked("c")]  # one alone: itself
        assert frames(peers.gateway) == [many[-1]]
        links.flush()
        assert not peers.worker.poll(100) and not peers.gateway.poll(100)  # nothing held twice


def test_what_is_held_goes_before_a_message_of_another_kind_is_handled(tmp_path) -> None:
    """A reply held while a job's report (or a store's command) is handled would wait for that
    handling's database writes."""
    sent_before: list[tuple[str, bool]] = []
    with connected(tmp_path) as peers:
        poller = zmq.Poller()
        peers.links.register(poller)

        def handle(_: bytes, message: W.Message) -> None:
            sent_before.append((type(message).__name__, bool(peers.gateway.poll(200))))

        for message in (W.Generate("g", "acme", "m", W.SamplingParams()), W.Status()):
            peers.links.reply(peers.identity, W.Started("r", 1))  # held
            peers.gateway.send(W.encode(message))
            events = dict(poller.poll(2000))
            assert events
            peers.links.drain(events, handle, lambda identity, message: None)
        assert sent_before == [("Generate", False), ("Status", True)]
        assert frames(peers.gateway) == [W.Replies([W.Started("r", 1), W.Started("r", 1)])]


def test_a_message_not_of_two_frames_or_undecodable_is_dropped_and_the_rest_handled(
        tmp_path) -> None:
    ctx = zmq.Context()
    links = Links(ctx, f"ipc://{tmp_path}/front.sock", f"ipc://{tmp_path}/back.sock")
    gateway = ctx.socket(zmq.DEALER)
    handled: list[tuple[bytes, W.Message]] = []
    try:
        gateway.setsockopt(zmq.IDENTITY, b"gw")
        gateway.connect(f"ipc://{tmp_path}/front.sock")
        gateway.send(W.encode(W.Abort(["first"])))
        gateway.send_multipart([W.encode(W.Abort(["two"])), W.encode(W.Abort(["frames"]))])
        gateway.send(b"\x00not msgpack")
        gateway.send(W.encode(W.Abort(["last"])))
        poller = zmq.Poller()
        links.register(poller)
        while len(handled) < 2 and (events := dict(poller.poll(2000))):
            links.drain(events, lambda identity, message: handled.append((identity, message)),
                        lambda identity, message: None)
        assert handled == [(b"gw", W.Abort(["first"])), (b"gw", W.Abort(["last"]))]
    finally:
        gateway.close(0)
        links.close()
        ctx.term()

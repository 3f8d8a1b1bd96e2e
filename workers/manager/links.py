"""The manager's two sockets: a ROUTER in front for gateways, a ROUTER behind for inference
workers and trainers (identities: worker keys). Messages are `wire.manager` structs; anything
else that arrives is dropped with a warning, never passed on.

Requests to a worker and replies to a gateway are held until `flush` (the end of the loop's
turn), until another message goes to the same peer (which they precede), or until a message of
another kind comes in (its handling may take long: a job's report, a store's command), and go
as one frame a peer (`W.framed`): a request of 2,048 prompts reaches its worker as one frame,
and the replies of a drain reach each gateway as one frame of up to `SHARE`.

Neither bounds its queues: a ROUTER drops, silently, what it sends a peer past ZeroMQ's default
high-water mark (1,000 frames a pipe). What is in flight is bounded before it comes here: by the
gateway's limits on a tenant's requests and a request's prompts."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable

import msgspec
import zmq

from wire import manager as W
from wire import spawner as S

log = logging.getLogger("workers.manager")
Handler = Callable[[bytes, W.Message], None]
# Flags as plain ints, frames sent and read one by one: pyzmq's `send_multipart` and
# `recv_multipart` combine its enum flags with `|` a frame (~3 us a message each way, as much as
# the rest of a send), and every prompt of a request passes here six times.
NOBLOCK, MORE = int(zmq.NOBLOCK), int(zmq.SNDMORE)
SHARE = 256  # replies held for a gateway at most: the first of a long drain go on meanwhile
TRAFFIC = W.Generate | W.Generates | W.Reply | W.Replies  # what comes in without a flush


class Links:
    def __init__(self, ctx: zmq.Context, front: str, back: str) -> None:
        self.front = _router(ctx, front)
        self.back = _router(ctx, back)
        self._replies: dict[bytes, list[W.Reply]] = {}  # by gateway, held until `flush`
        self._requests: dict[str, list[W.Generate]] = {}  # by worker key, held until `flush`

    def register(self, poller: zmq.Poller) -> None:
        poller.register(self.front, zmq.POLLIN)
        poller.register(self.back, zmq.POLLIN)

    def drain(self, events: dict, from_gateway: Handler, from_worker: Handler) -> None:
        """Handle every message waiting on the sockets that `events` (a poll's) names."""
        if self.front in events:
            _drain(self.front, from_gateway, self.flush)
        if self.back in events:
            _drain(self.back, from_worker, self.flush)

    def reply(self, gateway: bytes, message: msgspec.Struct) -> None:
        """`message` to `gateway`; a reply to a request is held until `flush`."""
        if isinstance(message, W.Reply):
            held = self._replies.setdefault(gateway, [])
            held.append(message)
            if len(held) >= SHARE:
                self._flush_replies(gateway)
            return
        self._flush_replies(gateway)
        self._to_gateway(gateway, message)

    def to_trainer(self, job_id: str, message: msgspec.Struct) -> None:
        self.to_worker(S.trainer_key(job_id), message)

    def to_worker(self, key: str, message: msgspec.Struct) -> None:
        """`message` to worker `key`; a request is held until `flush`."""
        if isinstance(message, W.Generate):
            self._requests.setdefault(key, []).append(message)
            return
        self._flush_requests(key)
        self._to_worker(key, message)

    def flush(self) -> None:
        """Send what is held: one frame a peer."""
        for gateway in list(self._replies):
            self._flush_replies(gateway)
        for key in list(self._requests):
            self._flush_requests(key)

    def _flush_replies(self, gateway: bytes) -> None:
        held = self._replies.pop(gateway, None)
        if held:
            self._to_gateway(gateway, W.framed(held))

    def _flush_requests(self, key: str) -> None:
        held = self._requests.pop(key, None)
        if held:
            self._to_worker(key, W.framed(held))

    def _to_gateway(self, gateway: bytes, message: msgspec.Struct) -> None:
        self.front.send(gateway, MORE)
        self.front.send(W.encode(message))

    def _to_worker(self, key: str, message: msgspec.Struct) -> None:
        with contextlib.suppress(zmq.ZMQError):  # not connected (yet, or anymore)
            self.back.send(key.encode(), MORE | NOBLOCK)
            self.back.send(W.encode(message), NOBLOCK)

    def close(self) -> None:
        self.front.close()
        self.back.close()


def _router(ctx: zmq.Context, endpoint: str) -> zmq.Socket:
    socket = ctx.socket(zmq.ROUTER)
    socket.setsockopt(zmq.LINGER, 0)
    socket.setsockopt(zmq.SNDHWM, 0)
    socket.setsockopt(zmq.RCVHWM, 0)
    socket.bind(endpoint)
    return socket


def _drain(sock: zmq.Socket, handler: Handler, before_other: Callable[[], None]) -> None:
    """Handle each message waiting; `before_other` before one that is neither a request nor a
    reply."""
    while True:
        try:
            frames = _frames(sock)
        except zmq.Again:
            return
        if len(frames) != 2:
            continue  # not ours
        identity, body = frames
        try:
            message = W.decode(body)
        except (msgspec.DecodeError, msgspec.ValidationError):
            log.warning("undecodable message from %r", identity)
            continue
        if not isinstance(message, TRAFFIC):
            before_other()
        handler(identity, message)


def _frames(sock: zmq.Socket) -> list[bytes]:
    """The next message's frames (zmq.Again: none waits)."""
    frames = [sock.recv(NOBLOCK)]
    while sock.get(zmq.RCVMORE):
        frames.append(sock.recv(NOBLOCK))
    return frames

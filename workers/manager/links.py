"""The manager's two sockets: a ROUTER in front for gateways, a ROUTER behind for inference
workers and trainers (identities: worker keys). Messages are `wire.manager` structs; anything
else that arrives is dropped with a warning, never passed on.

Neither bounds its queues: a ROUTER drops, silently, what it sends a peer past ZeroMQ's default
high-water mark (1,000 messages a pipe), and one request's 2,048 prompts send 2,048 Generates
to a worker at once (to one still starting, all at once when it is ready) and 4,096 Starteds
and Dones to a gateway. What is in flight is bounded before it comes here: by the gateway's
limits on a tenant's requests and a request's prompts."""

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


class Links:
    def __init__(self, ctx: zmq.Context, front: str, back: str) -> None:
        self.front = _router(ctx, front)
        self.back = _router(ctx, back)

    def register(self, poller: zmq.Poller) -> None:
        poller.register(self.front, zmq.POLLIN)
        poller.register(self.back, zmq.POLLIN)

    def drain(self, events: dict, from_gateway: Handler, from_worker: Handler) -> None:
        """Handle every message waiting on the sockets that `events` (a poll's) names."""
        if self.front in events:
            _drain(self.front, from_gateway)
        if self.back in events:
            _drain(self.back, from_worker)

    def reply(self, gateway: bytes, message: msgspec.Struct) -> None:
        self.front.send_multipart([gateway, W.encode(message)])

    def to_trainer(self, job_id: str, message: msgspec.Struct) -> None:
        self.to_worker(S.trainer_key(job_id), message)

    def to_worker(self, key: str, message: msgspec.Struct) -> None:
        with contextlib.suppress(zmq.ZMQError):  # not connected (yet, or anymore)
            self.back.send_multipart([key.encode(), W.encode(message)], zmq.NOBLOCK)

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


def _drain(sock: zmq.Socket, handler: Handler) -> None:
    while True:
        try:
            identity, body = sock.recv_multipart(zmq.NOBLOCK)
        except zmq.Again:
            return
        except ValueError:
            continue  # not two frames: not ours
        try:
            message = W.decode(body)
        except (msgspec.DecodeError, msgspec.ValidationError):
            log.warning("undecodable message from %r", identity)
            continue
        handler(identity, message)

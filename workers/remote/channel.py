"""The control link to one executor: a DEALER socket that sends messages and waits for the reply
it wants, pinging the executor while it waits so that a dead one is noticed within seconds."""

from __future__ import annotations

import contextlib
import os
import secrets
import time
from collections.abc import Callable

import msgspec
import zmq

from wire.call import messages as P
from workers.remote.handle import ExecutorError, ExecutorUnavailable


class Reconnect(Exception):
    """The executor no longer knows this worker (it restarted): say hello again."""


class Channel:
    def __init__(self, ctx: zmq.Context, endpoint: str, name: str, heartbeat_s: float,
                 curve_server_key: str | None) -> None:
        self.endpoint = endpoint
        self.heartbeat_s = heartbeat_s
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDTIMEO, int(heartbeat_s * 1000))  # a dead peer must not hang
        sock.setsockopt(zmq.IDENTITY, f"{name}-{os.getpid()}-{secrets.token_hex(4)}".encode())
        if curve_server_key:
            public, secret = zmq.curve_keypair()
            sock.curve_publickey, sock.curve_secretkey = public, secret
            sock.curve_serverkey = curve_server_key.encode()
        sock.connect(endpoint)
        self.socket = sock

    def close(self, goodbye: bool = False) -> None:
        if goodbye:
            with contextlib.suppress(zmq.ZMQError):
                self.socket.send(P.encode(P.Bye()), zmq.NOBLOCK)
        self.socket.close(0)

    def send(self, frames: list) -> None:
        try:
            self.socket.send_multipart(frames, copy=len(frames) == 1)
        except zmq.Again:
            raise ExecutorUnavailable(f"executor at {self.endpoint} is not taking messages") \
                from None

    def request(self, message: msgspec.Struct, reply_type: type,
                timeout_s: float | None, ping: bool = True) -> msgspec.Struct:
        """Sends `message` and returns the next reply of `reply_type`; raises ExecutorError at
        once when the executor refuses the message instead (an error for no call)."""
        self.send([P.encode(message)])
        reply = self.wait(lambda m: isinstance(m, reply_type) or _refusal(m), timeout_s,
                          ping)[0]
        if _refusal(reply):
            raise ExecutorError(reply.code, f"{type(message).__name__.lower()} refused: "
                                f"{reply.message}")
        return reply

    def wait(self, wanted: Callable[[msgspec.Struct], bool], timeout_s: float | None,
             ping: bool = True) -> tuple[msgspec.Struct, list]:
        """The next reply `wanted` accepts, with its extra frames; pings while waiting (if
        `ping`) and raises ExecutorUnavailable when a ping goes unanswered."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        pinged_at: float | None = None
        while True:
            frames = self._receive(self._next_wait(deadline, timeout_s))
            if frames is not None:
                message = P.decode_reply(frames[0].buffer)
                if isinstance(message, P.Pong):
                    pinged_at = None
                    if not message.known:
                        raise Reconnect
                elif wanted(message):
                    return message, frames[1:]
                continue
            if not ping:
                continue
            if pinged_at is not None and time.monotonic() - pinged_at > self.heartbeat_s:
                raise ExecutorUnavailable(f"executor at {self.endpoint} stopped answering")
            if pinged_at is None:
                pinged_at = time.monotonic()
                self.send([P.encode(P.Ping())])

    def check_alive(self) -> None:
        """One ping: returns if the executor knows this worker, else raises."""
        self.send([P.encode(P.Ping())])
        deadline = time.monotonic() + self.heartbeat_s
        while (wait := deadline - time.monotonic()) > 0:
            frames = self._receive(wait)
            if frames is None:
                break
            message = P.decode_reply(frames[0].buffer)
            if isinstance(message, P.Pong):
                if not message.known:
                    raise Reconnect
                return
        raise ExecutorUnavailable(f"executor at {self.endpoint} stopped answering")

    def _receive(self, wait_s: float) -> list | None:
        self.socket.setsockopt(zmq.RCVTIMEO, max(1, int(wait_s * 1000)))
        try:
            return self.socket.recv_multipart(copy=False)
        except zmq.Again:
            return None

    def _next_wait(self, deadline: float | None, timeout_s: float | None) -> float:
        """How long to wait before the next liveness check; raises once past the deadline."""
        wait = self.heartbeat_s
        if deadline is not None:
            wait = min(wait, deadline - time.monotonic())
            if wait <= 0:
                raise ExecutorUnavailable(f"no reply from {self.endpoint} in {timeout_s} s")
        return wait


def _refusal(message: msgspec.Struct) -> bool:
    """The executor's answer to a message it would not take (not to a call)."""
    return isinstance(message, P.Error) and message.id < 0

"""Is a service there? One ping over its own link (the launcher's readiness checks, compose's
healthchecks and tests use these, never log lines)."""

from __future__ import annotations

import zmq

from wire import manager as W
from wire.call import messages as P


def _ask(endpoint: str, request: bytes, decode, expected: type, timeout_ms: int,
         server_key: str | None = None) -> bool:
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    if server_key:
        sock.curve_publickey, sock.curve_secretkey = zmq.curve_keypair()
        sock.curve_serverkey = server_key.encode()
    sock.setsockopt(zmq.IMMEDIATE, 1)  # a list of replicas: ask one that is connected
    try:
        connect_all(sock, endpoint)
        if not sock.poll(timeout_ms, zmq.POLLOUT):  # nobody there: a plain send would wait
            return False  # for a peer forever (and hold off the caller's signals meanwhile)
        sock.send(request, zmq.NOBLOCK)
        return bool(sock.poll(timeout_ms)) and isinstance(decode(sock.recv()), expected)
    except Exception:  # anything but a well-formed answer means "not ready"
        return False
    finally:
        sock.close()
        ctx.term()


def endpoints(listed: str) -> list[str]:
    """A comma-separated list of endpoints (replicas of one service) -> the endpoints."""
    return [e.strip() for e in listed.split(",") if e.strip()]


def connect_all(sock: zmq.Socket, listed: str) -> None:
    for endpoint in endpoints(listed):
        sock.connect(endpoint)


def executor_answers(endpoint: str, timeout_ms: int = 2000, server_key: str | None = None) -> bool:
    return _ask(endpoint, P.encode(P.Ping()), P.decode_reply, P.Pong, timeout_ms, server_key)


def manager_answers(endpoint: str, timeout_ms: int = 3000) -> bool:
    return _ask(endpoint, W.encode(W.Status()), W.decode, W.StatusReply, timeout_ms)

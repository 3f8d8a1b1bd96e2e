"""`python -m executor.ping ENDPOINT`: exit 0 if the executor answers (container healthcheck)."""

from __future__ import annotations

import os
import sys

import zmq

from executor import protocol as P


def ping(endpoint: str, timeout_ms: int = 2000, server_key: str | None = None) -> bool:
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    if server_key:
        sock.curve_publickey, sock.curve_secretkey = zmq.curve_keypair()
        sock.curve_serverkey = server_key.encode()
    try:
        sock.connect(endpoint)
        sock.send(P.encode(P.Ping()))
        return bool(sock.poll(timeout_ms)) and isinstance(P.decode_reply(sock.recv()), P.Pong)
    finally:
        sock.close()
        ctx.term()


def main() -> int:
    endpoint = sys.argv[1] if len(sys.argv) > 1 else os.environ["SYMBIOSIS_EXECUTOR"]
    return 0 if ping(endpoint, server_key=os.environ.get("SYMBIOSIS_EXECUTOR_CURVE_PUBLIC")) \
        else 1


if __name__ == "__main__":
    raise SystemExit(main())

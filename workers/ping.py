"""`python -m workers.ping ENDPOINT`: exit 0 if the worker manager answers (healthcheck)."""

from __future__ import annotations

import os
import sys

import zmq

from workers import protocol as W


def main() -> int:
    endpoint = sys.argv[1] if len(sys.argv) > 1 else os.environ["SYMBIOSIS_MANAGER"]
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    try:
        sock.connect(endpoint)
        sock.send(W.encode(W.Status()))
        ok = bool(sock.poll(3000)) and isinstance(W.decode(sock.recv()), W.StatusReply)
    finally:
        sock.close()
        ctx.term()
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())

"""`python -m gateway [--host] [--port]`: serve the HTTP API (settings from SYMBIOSIS_* env)."""

from __future__ import annotations

import argparse
import logging
import socket

import uvicorn
from uvicorn.config import STARTUP_FAILURE

from gateway.app import create_app
from gateway.settings import GatewaySettings
from state.storage import private_files


def main(argv: list[str] | None = None) -> int:
    private_files()
    logging.basicConfig(level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    parser = argparse.ArgumentParser(prog="python -m gateway")
    parser.add_argument("--host")
    parser.add_argument("--port", type=int)
    parser.add_argument("--fd", type=int,
                        help="serve on this already bound socket (the launcher binds the port "
                             "itself, exclusively, before it starts anything)")
    args = parser.parse_args(argv)
    flags = {"host": args.host, "port": args.port}
    settings = GatewaySettings(**{k: v for k, v in flags.items() if v is not None})
    where = {} if args.fd is not None else {"host": settings.host, "port": settings.port}
    server = uvicorn.Server(uvicorn.Config(create_app(settings), log_level="warning",
                                           timeout_graceful_shutdown=5, **where))
    server.run(sockets=None if args.fd is None else [inherited(args.fd)])
    return 0 if server.started else STARTUP_FAILURE  # as uvicorn.run exits


def inherited(fd: int) -> socket.socket:
    """The launcher's listening socket as what it is (family, type and protocol read from the
    descriptor). Uvicorn's own `fd=` takes any descriptor for a Unix socket, so asyncio never
    sets TCP_NODELAY on its connections, and every response then waits ~40 ms for the client's
    delayed ACK (Nagle's algorithm holds its second write)."""
    return socket.socket(fileno=fd)


if __name__ == "__main__":
    raise SystemExit(main())

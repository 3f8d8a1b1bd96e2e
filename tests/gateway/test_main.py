"""`python -m gateway --fd N` serves the launcher's listening socket as the TCP socket it is:
asyncio then sets TCP_NODELAY on every connection. Served as uvicorn's `fd=` takes it (a Unix
socket), connections kept Nagle's algorithm and each response waited ~40 ms for the client's
delayed ACK."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys

from gateway.__main__ import inherited


def launcher_listener() -> socket.socket:
    """A listening socket made as `launcher.stack.Stack.bind` makes it."""
    listener = socket.socket(socket.AF_INET)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    return listener


def nodelay_of_a_connection(listening: socket.socket) -> int:
    """TCP_NODELAY of a connection an asyncio server accepts on `listening` (as uvicorn's does)."""
    async def serve() -> int:
        accepted: asyncio.Future = asyncio.get_running_loop().create_future()

        class Probe(asyncio.Protocol):
            def connection_made(self, transport: asyncio.BaseTransport) -> None:
                sock = transport.get_extra_info("socket")
                accepted.set_result(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))

        server = await asyncio.get_running_loop().create_server(Probe, sock=listening)
        _, writer = await asyncio.open_connection(*listening.getsockname()[:2])
        try:
            return await asyncio.wait_for(accepted, 10)
        finally:
            writer.close()
            server.close()
            await server.wait_closed()

    return asyncio.run(serve())


def test_the_inherited_socket_gives_connections_tcp_nodelay() -> None:
    listener = launcher_listener()
    assert nodelay_of_a_connection(inherited(listener.detach())) == 1


def test_the_socket_as_uvicorns_fd_option_takes_it_keeps_nagle() -> None:
    """The check tells the two apart: the descriptor taken for a Unix socket gets no NODELAY."""
    listener = launcher_listener()
    as_unix = socket.fromfd(listener.fileno(), socket.AF_UNIX, socket.SOCK_STREAM)
    listener.close()
    assert nodelay_of_a_connection(as_unix) == 0


def test_a_gateway_that_cannot_start_on_the_socket_exits_with_uvicorns_startup_failure(
        tmp_path) -> None:
    (tmp_path / "tenants.json").write_text("{not json")
    listener = launcher_listener()
    run = subprocess.run([sys.executable, "-m", "gateway", "--fd", str(listener.fileno())],
                         pass_fds=(listener.fileno(),), capture_output=True, text=True,
                         timeout=120, env={**os.environ, "SYMBIOSIS_DATA_DIR": str(tmp_path),
                                           "SYMBIOSIS_API_KEYS": "acme=sk-acme"})
    listener.close()
    assert run.returncode == 3, run.stderr[-2000:]  # uvicorn's STARTUP_FAILURE
    assert "Application startup failed" in run.stderr

"""Socket directories: a fresh one removes those its kind's killed processes left behind."""

from __future__ import annotations

import os
import socket
from pathlib import Path

from wire.endpoints import fresh_dir


def bound(directory: Path, listening: bool) -> socket.socket:
    directory.mkdir(mode=0o700)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(directory / "workers.sock"))
    if listening:
        server.listen()
    return server


def test_a_fresh_directory_removes_only_the_ones_nobody_listens_in(short_dir) -> None:
    killed = bound(short_dir / "workers-killed", listening=True)
    killed.close()  # as kill -9 leaves it: the socket file stays, nobody answers
    alive = bound(short_dir / "workers-alive", listening=True)
    never_listened = bound(short_dir / "workers-starting", listening=False)
    never_listened.close()
    (short_dir / "workers-unbound").mkdir()  # its process has not bound yet
    (short_dir / "other-killed").mkdir()
    (short_dir / "other-killed" / "workers.sock").symlink_to(short_dir / "workers-killed")
    try:
        made = fresh_dir(short_dir, "workers-", "workers.sock")
        assert made.parent == short_dir and made.name.startswith("workers-")
        assert os.stat(made).st_mode & 0o777 == 0o700
        assert sorted(p.name for p in short_dir.iterdir()) == sorted(
            [made.name, "workers-alive", "workers-unbound", "other-killed"])
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
            client.connect(str(short_dir / "workers-alive" / "workers.sock"))  # untouched
    finally:
        alive.close()

"""Socket directories: a fresh one removes those its kind's killed processes left behind."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

from wire.endpoints import SETTLED_S, fresh_dir


def bound(directory: Path, listening: bool, age_s: float = 0.0) -> socket.socket:
    directory.mkdir(mode=0o700)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(directory / "workers.sock"))
    if listening:
        server.listen()
    then = time.time() - age_s
    os.utime(directory / "workers.sock", (then, then))
    return server


def test_a_fresh_directory_removes_only_its_kinds_whose_listener_is_gone(short_dir) -> None:
    old = SETTLED_S + 5
    killed = bound(short_dir / "workers-killed", listening=True, age_s=old)
    killed.close()  # as kill -9 leaves it: the socket file stays, nobody answers
    alive = bound(short_dir / "workers-alive", listening=True, age_s=old)
    starting = bound(short_dir / "workers-starting", listening=False)  # bound, not yet listening
    other = bound(short_dir / "other-killed", listening=True, age_s=old)  # not of its kind
    other.close()
    (short_dir / "workers-unbound").mkdir()  # its process has not bound yet
    try:
        made = fresh_dir(short_dir, "workers-", "workers.sock")
        assert made.parent == short_dir and made.name.startswith("workers-")
        assert os.stat(made).st_mode & 0o777 == 0o700
        assert sorted(p.name for p in short_dir.iterdir()) == sorted(
            [made.name, "workers-alive", "workers-starting", "workers-unbound", "other-killed"])
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
            client.connect(str(short_dir / "workers-alive" / "workers.sock"))  # untouched
    finally:
        alive.close()
        starting.close()

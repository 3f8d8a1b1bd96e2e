"""Where the internal sockets live: the one definition of each default address, and the private
directory that holds ipc:// sockets.

ipc:// sockets go in a directory of this user's alone (`$XDG_RUNTIME_DIR/symbiosis`, else
`/tmp/symbiosis-<uid>`), created with mode 0700 and refused when another user owns it or can
write to it: on a shared host nobody else can pre-create it, plant a socket there or reach the
services through it. A process's own directory there (`fresh_dir`) first clears the ones of its
kind whose process was killed before it could remove them.
"""

from __future__ import annotations

import os
import shutil
import socket
import stat
import tempfile
import time
from pathlib import Path

from wire.host import host

SETTLED_S = 10.0  # a socket bound this long ago is listened on, unless its process is gone


class UnsafeDirectory(RuntimeError):
    pass


def runtime_dir() -> Path:
    base = host().runtime_dir
    if base is not None and base.is_dir():
        return base / "symbiosis"
    return Path("/tmp") / f"symbiosis-{os.geteuid()}"


def default_executor() -> str:
    return f"ipc://{runtime_dir()}/executor.sock"


def default_manager() -> str:
    return f"ipc://{runtime_dir()}/manager.sock"


def private_dir(path: Path) -> Path:
    """`path` as a directory only this user can enter (made if missing, checked if not)."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafeDirectory(f"{path} is not a directory")
    if st.st_uid != os.geteuid():
        raise UnsafeDirectory(f"{path} belongs to uid {st.st_uid}, not to this user "
                              f"({os.geteuid()}): refusing to put sockets there")
    if st.st_mode & 0o077:
        os.chmod(path, 0o700)  # ours: tighten it
    return path


def prepare(endpoint: str) -> str:
    """Before binding `endpoint`: an ipc:// socket's directory must be private to this user."""
    if endpoint.startswith("ipc://"):
        private_dir(Path(endpoint.removeprefix("ipc://")).parent)
    return endpoint


def fresh_dir(parent: Path, prefix: str, socket_name: str) -> Path:
    """A new private directory `parent/prefix*` for a socket `socket_name`, made after removing
    the ones of its kind left by processes killed while listening there (kill -9 skips their
    cleanup): a socket bound over SETTLED_S ago that nobody answers on. One without its socket,
    or with one just bound, is left alone (its process may be starting)."""
    private_dir(parent)
    for directory in parent.glob(f"{prefix}*"):
        if not directory.is_symlink() and directory.is_dir() and \
                _abandoned(directory / socket_name):
            shutil.rmtree(directory, ignore_errors=True)
    return Path(tempfile.mkdtemp(prefix=prefix, dir=parent))


def _abandoned(path: Path) -> bool:
    """A Unix socket file, not new, that refuses a connection: its listener is gone."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    if not stat.S_ISSOCK(st.st_mode) or time.time() - st.st_mtime < SETTLED_S:
        return False
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(1)  # a full backlog waits: alive
        try:
            probe.connect(str(path))
        except ConnectionRefusedError:
            return True
        except OSError:
            return False
    return False

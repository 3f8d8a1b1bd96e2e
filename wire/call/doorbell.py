"""Same-host fast path: call headers in shared memory, a named pipe per direction as doorbell.

A ZeroMQ round trip crosses six threads (the app and an IO thread on each side, both ways); on a
small VM each wake-up costs 50-100 us. With a doorbell the worker writes the call header into its
shared memory (`wire.call.header`) and one byte into its request pipe; the executor wakes, runs the
call and writes the reply header plus one byte into the reply pipe. A worker that expects its
reply soon watches the reply header for a moment before it sleeps on the pipe, so a quick reply
costs it no wake-up. ZeroMQ stays for everything else (hello, remap, ping, stats) and for other
hosts. The pipes live next to the shared memory and are unlinked once both ends are open; a side
that dies closes its ends, and the other sees end-of-file or a hang-up at once.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import secrets
import select
import stat
from pathlib import Path

log = logging.getLogger("wire.call.doorbell")

NAME_PREFIX = "symbiosis-bell-"
NAME = re.compile(rf"{NAME_PREFIX}[0-9A-Za-z_-]{{1,64}}")


class Hangup(Exception):
    """The other side closed its end of a doorbell pipe (it exited or forgot this client)."""


def _paths(prefix: Path) -> tuple[Path, Path]:
    return prefix.with_name(prefix.name + ".req"), prefix.with_name(prefix.name + ".rep")


class WorkerDoorbell:
    """The worker's ends: writes the request pipe, waits on the reply pipe."""

    def __init__(self, prefix: Path) -> None:
        self.prefix = prefix
        self.request_path, self.reply_path = _paths(prefix)
        self._request: int | None = None
        try:
            os.mkfifo(self.request_path, 0o600)
            os.mkfifo(self.reply_path, 0o600)
            self._reply = os.open(self.reply_path, os.O_RDONLY | os.O_NONBLOCK)
        except OSError:
            self.unlink()
            raise
        self._poll = select.poll()
        self._poll.register(self._reply, select.POLLIN)

    @classmethod
    def create_if_possible(cls, directory: Path) -> WorkerDoorbell | None:
        """A doorbell with a fresh name in `directory`; None where named pipes cannot be made
        there (the caller keeps to its socket)."""
        try:
            return cls(directory / f"{NAME_PREFIX}{os.getpid()}-{secrets.token_hex(6)}")
        except OSError as exc:
            log.info("no doorbell (%s): calls over the socket", exc)
            return None

    def open(self) -> None:
        """After the executor opened its ends (its welcome says so)."""
        self._request = os.open(self.request_path, os.O_WRONLY | os.O_NONBLOCK)
        self.unlink()

    def ring(self) -> None:
        try:
            os.write(self._request, b"\x01")
        except (BrokenPipeError, BlockingIOError) as exc:
            raise Hangup(str(exc)) from None

    def wait(self, timeout_s: float) -> bool:
        """True once the reply bell rang; False on timeout; Hangup if the executor went away."""
        for _, event in self._poll.poll(max(1, int(timeout_s * 1000))):
            try:
                data = os.read(self._reply, 64)
            except BlockingIOError:
                continue
            if data:
                return True
            if event & select.POLLHUP:
                raise Hangup("the executor closed the reply pipe")
        return False

    def unlink(self) -> None:
        for path in (self.request_path, self.reply_path):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)

    def close(self) -> None:
        self.unlink()
        for fd in (self._request, self._reply):
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._request = self._reply = None


def _open_pipe(directory: Path, name: str, flags: int, owner_uid: int) -> int:
    """Open a named pipe of the client's in `directory` and nothing else: a client names the
    path, and the executor must never write into (or read) a file some client pointed it at."""
    dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fd = os.open(name, flags | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    finally:
        os.close(dir_fd)
    st = os.fstat(fd)
    if not stat.S_ISFIFO(st.st_mode) or st.st_uid != owner_uid:
        os.close(fd)
        raise OSError(errno.EINVAL, f"{name} is not a named pipe of uid {owner_uid}")
    return fd


class ExecutorDoorbell:
    """The executor's ends: reads the request pipe, rings the reply pipe."""

    def __init__(self, prefix: str, directory: Path, owner_uid: int) -> None:
        path = Path(prefix)
        if path.parent != directory or not NAME.fullmatch(path.name):
            raise OSError(errno.EINVAL, f"doorbell {prefix} is not a {NAME_PREFIX}* in {directory}")
        request_path, reply_path = _paths(path)
        self.fd = _open_pipe(directory, request_path.name, os.O_RDONLY, owner_uid)
        try:
            self._reply = _open_pipe(directory, reply_path.name, os.O_WRONLY, owner_uid)
        except OSError:
            os.close(self.fd)
            raise

    def rang(self) -> bool:
        """Whether the worker rang since the last look (each call rings once). Hangup at EOF."""
        if self.fd < 0:  # closed by another thread meanwhile
            return False
        try:
            data = os.read(self.fd, 64)
        except BlockingIOError:
            return False
        if not data:  # end-of-file: no writer yet (still connecting) or the worker left
            if self._hung_up():
                raise Hangup("the worker closed the request pipe")
            return False
        return True

    def _hung_up(self) -> bool:
        """Linux flags POLLHUP only once a writer has come and gone, not before one came."""
        poller = select.poll()
        poller.register(self.fd, select.POLLIN)
        return any(event & select.POLLHUP for _, event in poller.poll(0))

    def answer(self) -> None:
        if self._reply < 0:
            return
        try:
            os.write(self._reply, b"\x01")
        except OSError as exc:  # the worker is gone; forgetting it is the IO thread's job
            if exc.errno not in (errno.EPIPE, errno.EAGAIN):
                raise

    def close(self) -> None:
        """Idempotent; a closed doorbell never rings and never answers (its fd numbers may
        already belong to someone else)."""
        fds, self.fd, self._reply = (self.fd, self._reply), -1, -1
        for fd in fds:
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)

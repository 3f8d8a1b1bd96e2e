"""The worker manager's hold on its data dir: the lock that makes it the records' one writer, and
the stores it writes through.

While a manager runs it holds an exclusive lock on DATA_DIR/manager.lock, which names the
endpoint it answers on: a tool that wants to change records (`symbiosis adapters register`)
asks the manager there, or, with no manager running, takes the lock itself for the time of its
change (`writing`). Either way one process writes at a time.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path

from catalogue.paths import local_path
from state.db import Database, db_path
from wire.store import StoreAction, StoreAnswer, StoreCommand
from workers.manager.adapter_store import AdapterRegistry
from workers.manager.batch_store import BatchStore
from workers.manager.chat_store import ChatStore
from workers.manager.conversation_store import ConversationStore
from workers.manager.file_store import FileStore
from workers.manager.inspector import Inspector
from workers.manager.job_ledger import JobLedger
from workers.manager.job_store import JobStore
from workers.manager.response_store import ResponseStore
from workers.manager.store_desk import StoreDesk
from workers.manager.upload_store import UploadStore

LOCK = "manager.lock"
log = logging.getLogger("workers.manager.records")


class Busy(Exception):
    """Another process holds the data dir: its endpoint (empty if it named none)."""


class Records:
    def __init__(self, data_dir: Path, base: str, endpoint: str) -> None:
        self.lock = _take(data_dir, endpoint)
        self.db = Database(db_path(data_dir))
        self.files = FileStore(self.db, data_dir)
        self.jobs = JobStore(self.db)
        self.registry = AdapterRegistry(self.db, data_dir, base, local_path(base))
        self.responses = ResponseStore(self.db, self.files.reserve)
        self.batches = BatchStore(self.db, self.files)
        self.chats = ChatStore(self.db, self.files.reserve)
        self.conversations = ConversationStore(self.db, self.files.reserve)
        self.uploads = UploadStore(self.db, data_dir, self.files.reserve)
        if swept := self.uploads.sweep():
            log.info("%d part file(s) of ended uploads deleted", swept)
        self.desk = StoreDesk(self.registry, self.files, self.jobs, self.responses,
                              self.batches, self.chats, self.conversations, self.uploads)
        self.ledger = JobLedger(self.jobs, self.files, data_dir)
        self.inspector = Inspector(self.registry.inspect)
        self._next_expiry = 0.0

    def take(self, to: bytes, command: StoreCommand) -> StoreAnswer | None:
        """The answer to `command`, or None while its upload is read off the loop (its answer
        then comes from `finished`)."""
        if command.action != StoreAction.ADD_ADAPTER:
            return self.desk.command(command)
        staged = self.desk.upload(command)
        if isinstance(staged, StoreAnswer):
            return staged
        self.inspector.submit(to, command, staged)
        return None

    def finished(self) -> Iterator[tuple[bytes, StoreAnswer]]:
        """The answers of the uploads read since last asked, their records written now."""
        for to, command, inspected in self.inspector.ready():
            yield to, self.desk.command(command, inspected)

    def expire(self, every_s: float = 60.0) -> None:
        """At most once every `every_s`: delete the files past their expiry (`expires_after`
        at upload) that no unfinished job reads, the stored responses and chat completions past
        their retention and the parts of uploads past their hour; they are gone for their
        tenants already."""
        if time.monotonic() < self._next_expiry:
            return
        self._next_expiry = time.monotonic() + every_s
        try:
            for file_id in self.desk.expire_files(int(time.time())):
                log.info("file %s expired: deleted", file_id)
            if gone := self.responses.expire(int(time.time())):
                log.info("%d stored response(s) past their retention: deleted", gone)
            if gone := self.chats.expire(int(time.time())):
                log.info("%d stored chat completion(s) past their retention: deleted", gone)
            for upload_id in self.uploads.expire(int(time.time())):
                log.info("upload %s expired: its parts deleted", upload_id)
        except Exception:  # housekeeping: the next sweep tries again; serving goes on
            log.exception("deleting expired files, responses, chat completions or uploads "
                          "failed")

    def close(self) -> None:
        self.inspector.close()
        self.db.close()
        os.close(self.lock)


def answer(records: Records | None, to: bytes, command: StoreCommand) -> StoreAnswer | None:
    """`Records.take`, or a 503 without records."""
    if records is None:
        return StoreAnswer(id=command.id, status=503, code="no_data_dir",
                           message="this worker manager keeps no records (no --data-dir)")
    return records.take(to, command)


@contextlib.contextmanager
def writing(data_dir: Path) -> Iterator[None]:
    """Hold the data dir while no manager runs (Busy with its endpoint while one does)."""
    fd = _take(data_dir, "")
    try:
        yield
    finally:
        os.close(fd)


def _take(data_dir: Path, endpoint: str) -> int:
    data_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(data_dir / LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        held = os.read(fd, 4096).decode(errors="replace").strip()
        os.close(fd)
        raise Busy(held) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, _reachable(endpoint).encode(), 0)
    return fd


def _reachable(endpoint: str) -> str:
    """An endpoint a local client can connect to (a wildcard bind becomes the loopback)."""
    for wildcard in ("tcp://*:", "tcp://0.0.0.0:"):
        if endpoint.startswith(wildcard):
            return "tcp://127.0.0.1:" + endpoint[len(wildcard):]
    return endpoint

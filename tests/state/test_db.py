"""The database's connections: the gateway's read-only one reads each thread on a connection of
its own, so a long read in one thread (a dashboard's sums) holds up no read in another; each
sees what the writer committed and refuses writes; a thread gone leaves no connection open."""

from __future__ import annotations

import os
import sqlite3
import threading
from pathlib import Path

import pytest

from state.db import Database, db_path


@pytest.fixture()
def both(tmp_path):
    writer = Database(db_path(tmp_path))
    reader = Database(db_path(tmp_path), read_only=True)
    yield writer, reader
    reader.close()
    writer.close()


def count_files(reader: Database) -> int:
    return len(reader.query("SELECT id FROM files"))


def test_a_long_read_in_one_thread_holds_up_no_read_in_another(both) -> None:
    _, reader = both
    begun, go, results = threading.Event(), threading.Event(), []

    def held() -> int:
        begun.set()
        return int(go.wait(30))

    def long_read() -> None:
        reader._reader().create_function("held", 0, held)
        results.append(reader.query("SELECT held()")[0][0])

    slow = threading.Thread(target=long_read)
    slow.start()
    assert begun.wait(30)
    quick = threading.Thread(target=lambda: results.append(count_files(reader)))
    quick.start()
    quick.join(10)
    meanwhile = list(results)
    go.set()
    slow.join(30)
    quick.join(30)
    assert meanwhile == [0] and results == [0, 1]  # the quick read answered first


def test_each_reader_sees_what_was_committed_and_writes_nothing(both) -> None:
    writer, reader = both
    with writer.transaction() as conn:
        conn.execute("INSERT INTO files (id, tenant, filename, purpose, bytes, created_at, path)"
                     " VALUES ('file-1', 'acme', 'a.jsonl', 'fine-tune', 3, 1, 'p')")
    seen, refused = [], []

    def read_then_write() -> None:
        seen.append(count_files(reader))
        try:
            reader.query("DELETE FROM files")
        except sqlite3.OperationalError as exc:
            refused.append(str(exc))

    thread = threading.Thread(target=read_then_write)
    thread.start()
    thread.join(30)
    assert seen == [1] == [count_files(reader)]
    assert refused == ["attempt to write a readonly database"]
    with pytest.raises(sqlite3.OperationalError, match="readonly"):
        reader.query("DELETE FROM files")
    assert count_files(reader) == 1


def test_threads_gone_leave_no_connection_open(both, tmp_path) -> None:
    _, reader = both

    def open_on_the_file() -> int:
        return sum(os.readlink(f"/proc/self/fd/{fd}") == str(db_path(tmp_path))
                   for fd in os.listdir("/proc/self/fd") if Path(f"/proc/self/fd/{fd}").exists())

    def read_in_threads(count: int) -> int:
        for _ in range(count):
            thread = threading.Thread(target=count_files, args=(reader,))
            thread.start()
            thread.join(30)
        return open_on_the_file()

    assert read_in_threads(10) == read_in_threads(30) <= 4  # not one more a thread

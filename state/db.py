"""The data dir's records in SQLite (WAL): the worker manager writes them on one connection
under one lock; the gateway only reads (`read_only`, a connection per thread). The schema is
brought up to date (`state.migrations`) by whoever opens the file first."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from state.migrations import MIGRATIONS, statements


def db_path(data_dir: Path) -> Path:
    """Where the state of a data dir lives (the one definition)."""
    return data_dir / "state.db"


class UnknownCursor(LookupError):
    """A list's `after` names nothing in that list (a wrong id, another tenant's, one deleted)."""

    def __init__(self, after: str) -> None:
        super().__init__(after)
        self.after = after


def after_cursor(items: list, ids: list[str], after: str | None) -> list:
    """The items past the one `after` names (all of them without it); UnknownCursor if none
    is named so."""
    if not after:
        return items
    if after not in ids:
        raise UnknownCursor(after)
    return items[ids.index(after) + 1:]


def page(items: list[dict], *, after: str | None, limit: int, order: str) -> \
        tuple[list[dict], bool]:
    """A page of `items` (each with an `id`; `order` "asc": as they are, "desc": the last
    first) past the one `after` names, and whether more follow."""
    items = items if order == "asc" else items[::-1]
    items = after_cursor(items, [item["id"] for item in items], after)
    return items[:limit], len(items) > limit


class Database:
    def __init__(self, path: Path, migrations: list[str] | None = None, *,
                 read_only: bool = False) -> None:
        """`read_only`: after bringing the schema up to date (whoever opens the file first),
        reads only (SQLite's query_only), each thread on a connection of its own, so that a
        long read in one thread (a dashboard's sums) holds up no other (WAL readers run side
        by side); a writer's threads share one connection under a lock."""
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path, self.read_only = path, read_only
        self.conn = self._connected()
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.lock = threading.RLock()
        self._migrate(migrations if migrations is not None else MIGRATIONS)
        self._readers: dict[threading.Thread, sqlite3.Connection] = {}
        self._mine = threading.local()
        if read_only:
            self.conn.execute("PRAGMA query_only=ON")

    def _connected(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        conn.row_factory = sqlite3.Row
        conn.execute("PRAGMA busy_timeout=5000")
        conn.execute("PRAGMA foreign_keys=ON")
        return conn

    def _reader(self) -> sqlite3.Connection:
        """This thread's read-only connection (those of threads gone are closed as another
        opens: a thread pool's idle threads come and go)."""
        conn = getattr(self._mine, "conn", None)
        if conn is None:
            conn = self._mine.conn = self._connected()
            conn.execute("PRAGMA query_only=ON")
            with self.lock:
                for gone in [thread for thread in self._readers if not thread.is_alive()]:
                    self._readers.pop(gone).close()
                self._readers[threading.current_thread()] = conn
        return conn

    def _migrate(self, migrations: list[str]) -> None:
        with self.transaction() as conn:
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            for number, script in enumerate(migrations[version:], start=version + 1):
                for statement in statements(script):
                    conn.execute(statement)
                conn.execute(f"PRAGMA user_version={number}")

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        with self.lock:
            self.conn.execute("BEGIN IMMEDIATE")
            try:
                yield self.conn
            except BaseException:
                self.conn.execute("ROLLBACK")
                raise
            try:
                self.conn.execute("COMMIT")
            except BaseException:  # a full disk fails here: the connection must not stay
                if self.conn.in_transaction:  # inside the transaction
                    self.conn.execute("ROLLBACK")
                raise

    def query(self, sql: str, params: tuple = ()) -> list[sqlite3.Row]:
        if self.read_only:
            return self._reader().execute(sql, params).fetchall()
        with self.lock:
            return self.conn.execute(sql, params).fetchall()

    def close(self) -> None:
        with self.lock:
            for conn in (self.conn, *self._readers.values()):
                conn.close()

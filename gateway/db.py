"""The gateway's state in SQLite (WAL) in the data dir: one connection, one lock, migrations."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

MIGRATIONS = [
    """
    CREATE TABLE models (
        id TEXT PRIMARY KEY,
        tenant TEXT NOT NULL,
        base TEXT NOT NULL,
        path TEXT NOT NULL,
        peft_type TEXT NOT NULL,
        created INTEGER NOT NULL,
        source TEXT NOT NULL DEFAULT 'registered',
        job_id TEXT
    );
    CREATE INDEX models_by_tenant ON models (tenant);
    """,
]


class Database:
    def __init__(self, path: Path, migrations: list[str] | None = None) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.conn = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self.conn.row_factory = sqlite3.Row
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute("PRAGMA busy_timeout=5000")
        self.conn.execute("PRAGMA foreign_keys=ON")
        self.lock = threading.RLock()
        self._migrate(migrations if migrations is not None else MIGRATIONS)

    def _migrate(self, migrations: list[str]) -> None:
        with self.transaction() as conn:
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            for number, script in enumerate(migrations[version:], start=version + 1):
                for statement in filter(str.strip, script.split(";")):
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
            self.conn.execute("COMMIT")

    def query(self, sql: str, params: tuple = ()) -> list[sqlite3.Row]:
        with self.lock:
            return self.conn.execute(sql, params).fetchall()

    def close(self) -> None:
        with self.lock:
            self.conn.close()

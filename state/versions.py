"""A model's immutable versions, and which of them serve its name.

A model id (`acme/support-bot`, `ft:...`) names versions 1, 2, ...; `acme/support-bot@2` names
one of them. `models.serving` is the name's traffic split, [[version, weight], ...]: one entry is
the version in service, several split the traffic by weight, none means nothing serves (a job's
result that failed its quality gates). Every change pushes the old split onto `models.history`,
so a rollback restores exactly what served before.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
import shutil
import sqlite3
from dataclasses import dataclass

from state.db import Database

MAX_HISTORY = 50
VERSION_SUFFIX = re.compile(r"^(?P<name>.+)@(?P<number>[0-9]{1,9})$")

Split = list[list[int]]  # [[version, weight], ...], ordered by version


@dataclass(frozen=True)
class VersionRecord:
    model: str
    number: int
    path: str
    peft_type: str
    created: int
    source: str
    job_id: str | None
    lineage: str  # JSON: the adapter's SHA-256 and PEFT config; a job's data and settings
    passed_gates: int

    @property
    def id(self) -> str:
        return f"{self.model}@{self.number}"


class VersionError(ValueError):
    """A lifecycle request that cannot be done; `status` is its HTTP status."""

    def __init__(self, message: str, status: int = 409) -> None:
        super().__init__(message)
        self.status = status


def split_id(model: str) -> tuple[str, int | None]:
    """`acme/bot@3` -> ("acme/bot", 3); an id without a version -> (id, None)."""
    match = VERSION_SUFFIX.match(model)
    return (match["name"], int(match["number"])) if match else (model, None)


def weights(serving: str) -> Split:
    return json.loads(serving)


def choose(model_id: str, split: Split, user: str | None) -> int:
    """The version that answers one request: by weight, the same for a given `user` as long as
    the split stays (a hash of the user places it on the split's cumulative weights)."""
    if len(split) == 1:
        return split[0][0]
    if user:
        digest = hashlib.sha256(f"{model_id}\n{user}".encode()).digest()
        point = int.from_bytes(digest[:8], "big") / 2**64
    else:
        point = random.random()
    total = sum(weight for _, weight in split)
    cumulative = 0.0
    for number, weight in split:
        cumulative += weight / total
        if point < cumulative:
            return number
    return split[-1][0]


class Versions:
    def __init__(self, db: Database) -> None:
        self.db = db

    def list(self, model_id: str) -> list[VersionRecord]:
        rows = self.db.query("SELECT * FROM versions WHERE model = ? ORDER BY number",
                             (model_id,))
        return [VersionRecord(**dict(r)) for r in rows]

    def get(self, model_id: str, number: int) -> VersionRecord | None:
        rows = self.db.query("SELECT * FROM versions WHERE model = ? AND number = ?",
                             (model_id, number))
        return VersionRecord(**dict(rows[0])) if rows else None

    def split(self, model_id: str, split: Split) -> None:
        """Serve the name by these weights (one entry: that version takes all traffic)."""
        with self.db.transaction() as conn:
            self.serve(conn, model_id, split)

    def rollback(self, model_id: str) -> Split:
        """Restore the split that served before the last change; the restored split."""
        with self.db.transaction() as conn:
            history = json.loads(conn.execute("SELECT history FROM models WHERE id = ?",
                                              (model_id,)).fetchone()[0])
            if not history:
                raise VersionError(f"{model_id} has nothing to roll back to: its serving "
                                   "versions never changed")
            previous = history.pop()
            self._write(conn, model_id, previous, history)
        return previous

    def delete(self, model_id: str, number: int) -> VersionRecord:
        """Delete a version that does not serve; rollbacks that would need it are forgotten."""
        with self.db.transaction() as conn:
            row = conn.execute("SELECT serving, history FROM models WHERE id = ?",
                               (model_id,)).fetchone()
            version = conn.execute("SELECT * FROM versions WHERE model = ? AND number = ?",
                                   (model_id, number)).fetchone()
            if row is None or version is None:
                raise VersionError(f"{model_id} has no version {number}", 404)
            if number in [n for n, _ in json.loads(row["serving"])]:
                raise VersionError(f"{model_id}@{number} is in service; promote or roll back "
                                   "to another version first")
            if conn.execute("SELECT COUNT(*) FROM versions WHERE model = ?",
                            (model_id,)).fetchone()[0] == 1:
                raise VersionError(f"{model_id}@{number} is the model's only version; delete "
                                   "the model instead")
            history = [s for s in json.loads(row["history"]) if number not in [n for n, _ in s]]
            conn.execute("UPDATE models SET history = ? WHERE id = ?",
                         (json.dumps(history), model_id))
            conn.execute("DELETE FROM versions WHERE model = ? AND number = ?",
                         (model_id, number))
        record = VersionRecord(**dict(version))
        shutil.rmtree(record.path, ignore_errors=True)
        return record

    def serve(self, conn: sqlite3.Connection, model_id: str, split: Split) -> None:
        """Inside a transaction: make `split` the name's serving split, the old one history."""
        split = sorted([int(n), int(w)] for n, w in split)
        known = {r[0] for r in conn.execute("SELECT number FROM versions WHERE model = ?",
                                            (model_id,))}
        missing = [n for n, _ in split if n not in known]
        if missing:
            raise VersionError(f"{model_id} has no version {missing[0]}", 404)
        if len({n for n, _ in split}) != len(split) or any(w <= 0 for _, w in split):
            raise VersionError("a split names each version once, with a positive weight", 400)
        row = conn.execute("SELECT serving, history FROM models WHERE id = ?",
                           (model_id,)).fetchone()
        old, history = json.loads(row["serving"]), json.loads(row["history"])
        if old != split and old:
            history = [*history, old][-MAX_HISTORY:]
        self._write(conn, model_id, split, history)

    @staticmethod
    def _write(conn: sqlite3.Connection, model_id: str, split: Split, history: list) -> None:
        if split:
            primary = max(split, key=lambda entry: (entry[1], entry[0]))[0]
        else:
            primary = conn.execute("SELECT MAX(number) FROM versions WHERE model = ?",
                                   (model_id,)).fetchone()[0]
        path, peft_type = conn.execute("SELECT path, peft_type FROM versions WHERE model = ? "
                                       "AND number = ?", (model_id, primary)).fetchone()
        conn.execute("UPDATE models SET serving = ?, history = ?, in_service = ?, version = ?, "
                     "path = ?, peft_type = ? WHERE id = ?",
                     (json.dumps(split), json.dumps(history), int(bool(split)), primary, path,
                      peft_type, model_id))

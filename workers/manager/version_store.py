"""The worker manager's writes to a model's versions: the split that serves its name, rollback
along its history, deleting a version that does not serve (`state.versions` reads them)."""

from __future__ import annotations

import json
import shutil
import sqlite3

from state.versions import Split, VersionReader, VersionRecord

MAX_HISTORY = 50


class VersionError(ValueError):
    """A lifecycle request that cannot be done; `status` is its HTTP status."""

    def __init__(self, message: str, status: int = 409) -> None:
        super().__init__(message)
        self.status = status


class Versions(VersionReader):
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
                raise VersionError(f"{model_id} has nothing to roll back to: no earlier "
                                   "serving versions are recorded (rollbacks undo changes "
                                   "one by one)")
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

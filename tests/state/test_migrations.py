"""The migrations' statements as SQLite itself reads a script: one at a time, a trigger's
body (with the `;` within it) and a quoted `;` kept whole."""

from __future__ import annotations

import sqlite3

from state.migrations import MIGRATIONS, statements

SCRIPT = """
    CREATE TABLE a (x TEXT);
    CREATE TABLE b (x TEXT);
    CREATE TRIGGER copied AFTER INSERT ON a BEGIN
        INSERT INTO b VALUES (NEW.x || ';');
        INSERT INTO b VALUES ('two; of them');
    END;
    """


def schema(conn: sqlite3.Connection) -> list[tuple]:
    return conn.execute("SELECT type, name, sql FROM sqlite_master ORDER BY name").fetchall()


def run(script: str, earlier: list[str]) -> tuple[sqlite3.Connection, sqlite3.Connection]:
    """Two databases after the `earlier` scripts: one given `script` whole by SQLite, one
    statement by statement as the migrations run."""
    whole, ours = sqlite3.connect(":memory:"), sqlite3.connect(":memory:")
    for before in earlier:
        whole.executescript(before)
        ours.executescript(before)
    whole.executescript(script)
    for statement in statements(script):
        ours.execute(statement)
    return whole, ours


def test_a_script_runs_statement_by_statement_as_sqlite_runs_it_whole() -> None:
    whole, ours = run(SCRIPT, [])
    assert schema(ours) == schema(whole) and len(list(statements(SCRIPT))) == 3
    ours.execute("INSERT INTO a VALUES ('one')")
    assert ours.execute("SELECT x FROM b").fetchall() == [("one;",), ("two; of them",)]


def test_every_migration_runs_as_sqlite_runs_it_whole() -> None:
    for number, script in enumerate(MIGRATIONS):
        whole, ours = run(script, MIGRATIONS[:number])
        assert schema(ours) == schema(whole), number

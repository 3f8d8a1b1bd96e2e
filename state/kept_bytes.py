"""What each tenant's records keep, in bytes by kind, as its storage quota counts them
(`kept_bytes`): SQLite's triggers keep the sums as the records change, whoever changes them, in
the same transaction, so a quota is asked in one lookup, not a sum over every record the tenant
keeps (which grew with them: 60 ms a call at 170 MB of stored responses, in the manager's
write transaction). A record's size: its text columns' UTF-8 bytes; a file's and an adapter
version's: the bytes their row says they keep on disk (a version's measured as it is recorded:
walking every adapter directory took 60 ms a call at 2,000 versions)."""

from __future__ import annotations

from typing import NamedTuple


class Counted(NamedTuple):
    table: str
    kind: str  # as `state.usage.stored_by_kind` names it
    columns: tuple[str, ...]  # what a row keeps
    tenant: str  # whose a row is, of `{row}` (NEW or OLD)
    measured: bool = False  # `columns` hold a size in bytes, not text

    def size(self, row: str = "") -> str:
        if self.measured:
            return " + ".join(f"COALESCE({row}{column}, 0)" for column in self.columns)
        return size(self.columns, row)


COUNTED = (
    Counted("responses", "responses", ("body", "conversation", "request"), "{row}.tenant"),
    Counted("chat_completions", "chat_completions", ("metadata", "body", "messages"),
            "{row}.tenant"),
    Counted("conversations", "conversations", ("metadata",), "{row}.tenant"),
    Counted("conversation_items", "conversations", ("item",),
            "(SELECT tenant FROM conversations WHERE id = {row}.conversation)"),
    Counted("batch_results", "batch_answers", ("result",),
            "(SELECT tenant FROM batches WHERE id = {row}.batch_id)"),
)
# added later (`MEASURED_MIGRATION`): what is kept on disk, as its row measures it
MEASURED = (
    Counted("files", "files", ("bytes",), "{row}.tenant", measured=True),
    Counted("versions", "adapters", ("bytes",),
            "(SELECT tenant FROM models WHERE id = {row}.model)", measured=True),
)


def size(columns: tuple[str, ...], row: str = "") -> str:
    """The bytes a row keeps (`row`: its name and a dot, or none)."""
    return " + ".join(f"COALESCE(LENGTH(CAST({row}{column} AS BLOB)), 0)" for column in columns)


def _added(counted: Counted, row: str, change: str) -> str:
    tenant = counted.tenant.format(row=row)
    return (f"INSERT INTO kept_bytes (tenant, kind, bytes) SELECT {tenant}, '{counted.kind}', "
            f"{change} WHERE {tenant} IS NOT NULL ON CONFLICT (tenant, kind) DO UPDATE SET "
            "bytes = bytes + excluded.bytes;")


def _triggers(counted: Counted) -> str:
    new, old = counted.size("NEW."), counted.size("OLD.")
    name = f"{counted.table}_kept"
    return f"""
    CREATE TRIGGER {name}_added AFTER INSERT ON {counted.table} BEGIN
        {_added(counted, "NEW", new)}
    END;
    CREATE TRIGGER {name}_changed AFTER UPDATE OF {", ".join(counted.columns)}
        ON {counted.table} BEGIN
        {_added(counted, "OLD", f"-({old})")}
        {_added(counted, "NEW", new)}
    END;
    CREATE TRIGGER {name}_gone AFTER DELETE ON {counted.table} BEGIN
        {_added(counted, "OLD", f"-({old})")}
    END;"""


def counting(counted: Counted) -> str:
    """The statements that count a table added later: what it holds now, then its triggers."""
    return _backfill(counted) + _triggers(counted)


def _backfill(counted: Counted) -> str:
    tenant = counted.tenant.format(row="r")
    return (f"INSERT INTO kept_bytes (tenant, kind, bytes) SELECT {tenant} AS t, "
            f"'{counted.kind}', SUM({counted.size('r.')}) FROM {counted.table} AS r "
            f"WHERE t IS NOT NULL GROUP BY t ON CONFLICT (tenant, kind) DO UPDATE SET "
            "bytes = bytes + excluded.bytes;")


# A conversation deleted takes its items with it (ON DELETE CASCADE), after its own row is gone:
# their trigger finds no tenant then, so the conversation gives back its items' bytes first.
MIGRATION = f"""
    CREATE TABLE kept_bytes (
        tenant TEXT NOT NULL,
        kind TEXT NOT NULL,
        bytes INTEGER NOT NULL,
        PRIMARY KEY (tenant, kind)
    );
    {"".join(_backfill(counted) for counted in COUNTED)}
    {"".join(_triggers(counted) for counted in COUNTED)}
    CREATE TRIGGER conversations_kept_items_gone BEFORE DELETE ON conversations BEGIN
        UPDATE kept_bytes SET bytes = bytes - (SELECT COALESCE(SUM({size(("item",))}), 0)
            FROM conversation_items WHERE conversation = OLD.id)
        WHERE tenant = OLD.tenant AND kind = 'conversations';
    END;
    """

# A version's `bytes` is NULL until measured: those recorded before are measured by the adapter
# registry as the manager starts (`AdapterRegistry.measure`), its update counted then.
MEASURED_MIGRATION = f"""
    ALTER TABLE versions ADD COLUMN bytes INTEGER;
    {"".join(_backfill(counted) for counted in MEASURED)}
    {"".join(_triggers(counted) for counted in MEASURED)}
    """

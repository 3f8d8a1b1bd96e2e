"""What a tenant keeps in the data directory, the measure of its storage quota: its files, its
stored responses, chat completions and conversations, its running batches' answers so far and
its adapters' versions (uploaded, registered or trained)."""

from __future__ import annotations

import os
from pathlib import Path

from state.db import Database
from state.kept_bytes import COUNTED, MEASURED, size

KINDS = tuple(dict.fromkeys(counted.kind for counted in COUNTED))  # the records' kinds
ALL_KINDS = tuple(counted.kind for counted in MEASURED) + KINDS  # files and adapters too

# what one record keeps, in bytes, as the quota counts it (also shown per record by the
# dashboard): a stored response's row; a conversation's metadata and items (its row as `c`)
RESPONSE_BYTES = size(COUNTED[0].columns)
CONVERSATION_BYTES = (f"{size(('metadata',), 'c.')} + COALESCE((SELECT "
                      f"SUM({size(('item',), 'i.')}) FROM conversation_items i WHERE "
                      "i.conversation = c.id), 0)")


def stored_bytes(db: Database, tenant: str) -> int:
    """Its files' sizes, its stored responses' (a background one's request too), chat
    completions', conversations' and batch answers' text (UTF-8) and its adapter versions'
    files."""
    return sum(stored_by_kind(db, tenant).values())


def stored_by_kind(db: Database, tenant: str) -> dict[str, int]:
    """`stored_bytes` by what keeps them, as `state.kept_bytes` keeps their sums."""
    kept = dict.fromkeys(ALL_KINDS, 0)
    kept.update((row["kind"], row["bytes"]) for row in db.query(
        "SELECT kind, bytes FROM kept_bytes WHERE tenant = ?", (tenant,)))
    return kept


def directory_bytes(root: Path) -> int:
    """The sizes of the files under `root` (0 if there is none); links are not followed."""
    total = 0
    for directory, _, names in os.walk(root):
        for name in names:
            try:
                total += os.lstat(os.path.join(directory, name)).st_size
            except FileNotFoundError:  # deleted while counted
                continue
    return total


def readable(size: int) -> str:
    """`size` bytes in words: "512 bytes", "6.8 KB", "1.5 MB", "2.0 GB"."""
    if size < 1024:
        return f"{size} bytes"
    for unit, scale in (("KB", 2**10), ("MB", 2**20)):
        if size < 1024 * scale:
            return f"{size / scale:.1f} {unit}"
    return f"{size / 2**30:.1f} GB"

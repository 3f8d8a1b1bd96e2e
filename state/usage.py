"""What a tenant keeps in the data directory, the measure of its storage quota: its files, its
stored responses, chat completions and conversations, its running batches' answers so far and
its adapters' versions (uploaded, registered or trained)."""

from __future__ import annotations

import os
from pathlib import Path

from state.db import Database

# what one record keeps, in bytes, as the quota counts it (also shown per record by the
# dashboard): a stored response's row; a conversation's metadata and items (its row as `c`)
RESPONSE_BYTES = ("LENGTH(CAST(body AS BLOB)) + LENGTH(CAST(conversation AS BLOB)) + "
                  "COALESCE(LENGTH(CAST(request AS BLOB)), 0)")
CONVERSATION_BYTES = ("LENGTH(CAST(c.metadata AS BLOB)) + COALESCE((SELECT "
                      "SUM(LENGTH(CAST(i.item AS BLOB))) FROM conversation_items i WHERE "
                      "i.conversation = c.id), 0)")


def stored_bytes(db: Database, data_dir: Path, tenant: str) -> int:
    """Its files' sizes, its stored responses' (a background one's request too), chat
    completions', conversations' and batch answers' text (UTF-8) and its adapter
    directories."""
    return sum(stored_by_kind(db, data_dir, tenant).values())


def stored_by_kind(db: Database, data_dir: Path, tenant: str) -> dict[str, int]:
    """`stored_bytes` by what keeps them."""
    files, responses, answers, chats, conversations = db.query(
        "SELECT (SELECT COALESCE(SUM(bytes), 0) FROM files WHERE tenant = ?), "
        f"(SELECT COALESCE(SUM({RESPONSE_BYTES}), 0) FROM responses WHERE tenant = ?), "
        "(SELECT COALESCE(SUM(LENGTH(CAST(r.result AS BLOB))), 0) FROM batch_results r "
        "JOIN batches b ON b.id = r.batch_id WHERE b.tenant = ?), "
        "(SELECT COALESCE(SUM(LENGTH(CAST(metadata AS BLOB)) + LENGTH(CAST(body AS BLOB)) + "
        "LENGTH(CAST(messages AS BLOB))), 0) FROM chat_completions WHERE tenant = ?), "
        f"(SELECT COALESCE(SUM({CONVERSATION_BYTES}), 0) FROM conversations c WHERE "
        "c.tenant = ?)",
        (tenant, tenant, tenant, tenant, tenant))[0]
    return {"files": files, "adapters": directory_bytes(data_dir / "adapters" / tenant),
            "responses": responses, "chat_completions": chats,
            "conversations": conversations, "batch_answers": answers}


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

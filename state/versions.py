"""A model's immutable versions, and which of them serve its name (read here; the worker
manager writes them, `workers.manager.version_store`).

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
from dataclasses import dataclass

from state.db import Database

VERSION_SUFFIX = re.compile(r"^(?P<name>.+)@(?P<number>[1-9][0-9]{0,8})$")  # one way to write each

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
    bytes: int | None = None  # its files' sizes (None: recorded before they were measured)

    @property
    def id(self) -> str:
        return f"{self.model}@{self.number}"


def split_id(model: str) -> tuple[str, int | None]:
    """`acme/bot@3` -> ("acme/bot", 3); an id without a version -> (id, None)."""
    match = VERSION_SUFFIX.fullmatch(model)
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


class VersionReader:
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

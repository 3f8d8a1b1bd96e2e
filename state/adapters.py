"""Tenants' adapters on disk, in PEFT format, each owned by one tenant (read here; the worker
manager writes them, `workers.manager.adapter_store`).

An adapter directory holds adapter_config.json and adapter_model.safetensors (loadable by
PeftModel.from_pretrained). Registering copies it into DATA_DIR/adapters/<tenant>/<uuid>/ as an
immutable version of a model: the `models` table holds the model ids clients use and which
versions serve them (state.versions), the `versions` table each version's directory and lineage.
"""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass
from pathlib import Path

from state.db import Database
from state.storage import DIR_MODE
from state.versions import VersionReader

FILES = ("adapter_config.json", "adapter_model.safetensors")
STAGED = re.compile(r"adapter-[0-9a-f]{24}")  # a staged upload's name, whole


@dataclass(frozen=True)
class AdapterRecord:
    """A model name (what /v1/models lists) and what it serves now."""

    id: str
    tenant: str
    base: str
    path: str  # the primary serving version's directory (the heaviest of a split)
    peft_type: str
    created: int
    source: str = "registered"
    job_id: str | None = None
    in_service: int = 1  # 0: no version serves (a job's result that failed its quality gates)
    serving: str = "[[1, 100]]"  # JSON [[version, weight], ...]; see state.versions
    history: str = "[]"  # JSON: earlier `serving` values, the latest last (for rollback)
    version: int = 1  # the primary serving version (or the latest, when none serves)


class AdapterReader:
    def __init__(self, db: Database, data_dir: Path, base: str) -> None:
        self.db = db
        self.data_dir = data_dir
        self.base = base
        self.versions = VersionReader(db)

    def staging(self) -> Path:
        return staging(self.data_dir)

    def staged(self, name: str) -> Path | None:
        """The staged upload of this name, or None when the name is not one `staging` gives."""
        return self.data_dir / "staging" / name if STAGED.fullmatch(name) else None

    def get(self, model_id: str) -> AdapterRecord | None:
        rows = self.db.query("SELECT * FROM models WHERE id = ?", (model_id,))
        return AdapterRecord(**dict(rows[0])) if rows else None

    def visible(self, model_id: str, tenant: str) -> AdapterRecord | None:
        record = self.get(model_id)
        return record if record is not None and record.tenant == tenant else None

    def list(self, tenant: str) -> list[AdapterRecord]:
        rows = self.db.query("SELECT * FROM models WHERE tenant = ? ORDER BY created, id",
                             (tenant,))
        return [AdapterRecord(**dict(r)) for r in rows]


def staging(data_dir: Path) -> Path:
    """A fresh private directory under `data_dir` for an adapter upload on its way in (the
    manager's `AdapterRegistry.register` takes it by name; the caller removes it otherwise)."""
    directory = data_dir / "staging" / f"adapter-{secrets.token_hex(12)}"
    directory.parent.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
    directory.mkdir(mode=DIR_MODE)
    return directory

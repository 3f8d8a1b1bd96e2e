"""Tenants' adapters on disk, in PEFT format, each owned by one tenant.

An adapter directory holds adapter_config.json and adapter_model.safetensors (loadable by
PeftModel.from_pretrained). Registering copies it into DATA_DIR/adapters/<tenant>/<uuid>/; the
`models` table maps the model id clients use to that directory.
"""

from __future__ import annotations

import json
import re
import shutil
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from state.db import Database

SUPPORTED = {"LORA", "IA3", "ADALORA", "PREFIX_TUNING", "PROMPT_TUNING"}
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
FILES = ("adapter_config.json", "adapter_model.safetensors")


class AdapterError(ValueError):
    pass


@dataclass(frozen=True)
class AdapterRecord:
    id: str
    tenant: str
    base: str
    path: str
    peft_type: str
    created: int
    source: str = "registered"
    job_id: str | None = None
    in_service: int = 1  # 0: a candidate that failed its quality gates (promote to serve it)


class AdapterRegistry:
    def __init__(self, db: Database, data_dir: Path, base: str) -> None:
        self.db = db
        self.root = data_dir / "adapters"
        self.base = base

    def register(self, tenant: str, name: str, source: Path, *, model_id: str | None = None,
                 origin: str = "registered", job_id: str | None = None,
                 in_service: bool = True) -> AdapterRecord:
        if model_id is None:
            if not NAME.match(name):
                raise AdapterError("adapter names use letters, digits, '.', '_' and '-' "
                                   "(at most 64)")
            model_id = f"{tenant}/{name}"
        peft_type = validate(source)
        if self.get(model_id) is not None:
            raise AdapterError(f"a model with id {model_id!r} already exists")
        target = self.root / tenant / uuid.uuid4().hex
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = target.with_suffix(".tmp")
        staging.mkdir()
        for filename in FILES:
            shutil.copyfile(source / filename, staging / filename)
        staging.rename(target)
        record = AdapterRecord(model_id, tenant, self.base, str(target), peft_type,
                               int(time.time()), origin, job_id, int(in_service))
        with self.db.transaction() as conn:
            conn.execute("INSERT INTO models (id, tenant, base, path, peft_type, created, "
                         "source, job_id, in_service) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                         (record.id, record.tenant, record.base, record.path, record.peft_type,
                          record.created, record.source, record.job_id, record.in_service))
        return record

    def promote(self, model_id: str) -> None:
        """Put a candidate in service."""
        with self.db.transaction() as conn:
            conn.execute("UPDATE models SET in_service = 1 WHERE id = ?", (model_id,))

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

    def delete(self, model_id: str) -> None:
        record = self.get(model_id)
        with self.db.transaction() as conn:
            conn.execute("DELETE FROM models WHERE id = ?", (model_id,))
        if record is not None:
            shutil.rmtree(record.path, ignore_errors=True)


def validate(directory: Path) -> str:
    """The PEFT type of an adapter directory, or AdapterError saying what is wrong."""
    for filename in FILES:
        if not (directory / filename).is_file():
            raise AdapterError(f"an adapter directory needs {filename}")
    try:
        config = json.loads((directory / "adapter_config.json").read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise AdapterError(f"adapter_config.json is not valid JSON: {exc}") from None
    if not isinstance(config, dict):
        raise AdapterError("adapter_config.json must hold a JSON object, not "
                           f"{type(config).__name__}")
    peft_type = str(config.get("peft_type", "")).upper()
    if peft_type not in SUPPORTED:
        raise AdapterError(f"peft_type {peft_type or 'missing'!r} is not supported "
                           f"(supported: {', '.join(sorted(SUPPORTED))})")
    if config.get("use_dora"):
        raise AdapterError("DoRA adapters need the base weights and cannot be served")
    with (directory / "adapter_model.safetensors").open("rb") as f:
        header = f.read(8)
    if len(header) < 8 or int.from_bytes(header, "little") > 100 * 2**20:
        raise AdapterError("adapter_model.safetensors is not a safetensors file")
    return peft_type

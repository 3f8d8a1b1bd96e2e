"""The worker manager's writes to tenants' adapters: a new immutable version from a directory
(checked against its config and the base model's weights), promote, withdraw, delete; the data
dir's one writer of the `models` and `versions` tables (`state.adapters` reads them)."""

from __future__ import annotations

import functools
import json
import logging
import re
import shutil
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from state.adapters import FILES, AdapterReader, AdapterRecord
from state.db import Database
from state.storage import (
    DIR_MODE,
    Reserve,
    delete_freeing_space,
    file_sha256,
    staged_dir,
    write_new,
)
from state.usage import directory_bytes
from state.versions import VersionRecord
from wire.store import ADAPTER_NAME, ADAPTER_NAME_RULE
from workers.manager.adapter_check import AdapterMismatch, check
from workers.manager.tensorfile import Shapes, TensorFileError, model_shapes, read_shapes
from workers.manager.version_store import Versions

log = logging.getLogger("workers.manager.adapters")
SUPPORTED = {"LORA", "IA3", "ADALORA", "PREFIX_TUNING", "PROMPT_TUNING"}
NAME = re.compile(ADAPTER_NAME)


class AdapterError(ValueError):
    def __init__(self, message: str, param: str = "adapter_model") -> None:
        super().__init__(message)
        self.param = param  # the upload's field at fault


@dataclass(frozen=True)
class Inspected:
    """What reading an adapter directory found: its PEFT type and its lineage (config and the
    digest of its tensors, which reads every byte of them)."""

    peft_type: str
    lineage: dict


class AdapterRegistry(AdapterReader):
    def __init__(self, db: Database, data_dir: Path, base: str,
                 base_dir: Path | None = None) -> None:
        """`base_dir`: the base model's directory, whose weights' shapes adapters must fit
        (None: checked against their own config only)."""
        super().__init__(db, data_dir, base)
        self.root = data_dir / "adapters"
        self.reserve = Reserve(data_dir)
        self.base_dir = base_dir
        self.versions = Versions(db)
        self.measure()

    @functools.cached_property
    def base_shapes(self) -> Shapes | None:
        if self.base_dir is None:
            return None
        try:
            return model_shapes(self.base_dir)
        except (OSError, ValueError, KeyError) as exc:
            log.warning("base model weights at %s not readable (%s): adapters are checked "
                        "against their config only", self.base_dir, exc)
            return None

    def register(self, tenant: str, name: str, source: Path, *, model_id: str | None = None,
                 origin: str = "registered", job_id: str | None = None,
                 in_service: bool = True, lineage: dict | None = None,
                 hold: bool = False, move: bool = False,
                 inspected: Inspected | None = None) -> VersionRecord:
        """Store `source` as a new immutable version: version 1 of a new model, or the next
        version of the tenant's model `name` (serving at once when `in_service`, unless `hold`:
        then it waits for `promote`, e.g. until a worker has loaded it). A `model_id` (a job's
        `ft:` model or checkpoint) names a model that has exactly one version. `move`: take
        `source` itself (a staged upload on this file system) instead of a copy. `inspected`:
        what `inspect` found in `source` already (off the manager's loop)."""
        named = model_id is None
        if named:
            if not NAME.fullmatch(name):
                raise AdapterError(f"adapter names use {ADAPTER_NAME_RULE}", "name")
            model_id = f"{tenant}/{name}"
        inspected = inspected or self.inspect(source)
        existing = self.get(model_id)
        if existing is not None and not named:
            raise AdapterError(f"a model with id {model_id!r} already exists", "name")
        target = self.root / tenant / uuid.uuid4().hex
        target.parent.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
        if move:
            source.rename(target)
        else:
            with staged_dir(target) as staging:
                for filename in FILES:
                    with (source / filename).open("rb") as f:
                        write_new(staging / filename, iter(lambda f=f: f.read(1 << 20), b""))
        try:
            return self._record(tenant, model_id, existing, target, inspected.peft_type, origin,
                                job_id, in_service, {**inspected.lineage, **(lineage or {})},
                                hold)
        except BaseException:  # no version without its files, no files without a version
            shutil.rmtree(target, ignore_errors=True)
            raise

    def _record(self, tenant: str, model_id: str, existing: AdapterRecord | None, target: Path,
                peft_type: str, origin: str, job_id: str | None, in_service: bool,
                lineage: dict, hold: bool = False) -> VersionRecord:
        created, size = int(time.time()), directory_bytes(target)
        with self.db.transaction() as conn:
            if existing is None:
                conn.execute("INSERT OR IGNORE INTO models (id, tenant, base, path, peft_type, "
                             "created, source, job_id, in_service, serving, history, version) "
                             "VALUES (?, ?, ?, ?, ?, ?, ?, ?, 0, '[]', '[]', 1)",
                             (model_id, tenant, self.base, str(target), peft_type, created,
                              origin, job_id))
            number = conn.execute("SELECT COALESCE(MAX(number), 0) + 1 FROM versions "
                                  "WHERE model = ?", (model_id,)).fetchone()[0]
            conn.execute("INSERT INTO versions (model, number, path, peft_type, created, "
                         "source, job_id, lineage, passed_gates, bytes) "
                         "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                         (model_id, number, str(target), peft_type, created, origin, job_id,
                          json.dumps(lineage), int(in_service), size))
            if in_service and not hold:
                self.versions.serve(conn, model_id, [[number, 100]])
        return self.versions.get(model_id, number)

    def inspect(self, source: Path) -> Inspected:
        """`source` checked (AdapterError saying what is wrong) and digested; reads no record,
        so it may run on a thread of its own."""
        return Inspected(validate(source, self.base_shapes), _lineage(source))

    def measure(self) -> None:
        """The sizes of versions recorded before sizes were kept (their quota's sum follows)."""
        for row in self.db.query("SELECT model, number, path FROM versions WHERE bytes IS NULL"):
            with self.db.transaction() as conn:
                conn.execute("UPDATE versions SET bytes = ? WHERE model = ? AND number = ? AND "
                             "bytes IS NULL", (directory_bytes(Path(row["path"])),
                                               row["model"], row["number"]))

    def withdraw(self, version: VersionRecord) -> None:
        """Forget a version that never served: the whole model if it was its only one."""
        if len(self.versions.list(version.model)) == 1:
            self.delete(version.model)
        else:
            self.versions.delete(version.model, version.number)

    def promote(self, model_id: str, number: int | None = None) -> None:
        """Serve one version (by default the latest) with all of the name's traffic."""
        with self.db.transaction() as conn:
            if number is None:
                number = conn.execute("SELECT MAX(number) FROM versions WHERE model = ?",
                                      (model_id,)).fetchone()[0]
            self.versions.serve(conn, model_id, [[number, 100]])

    def delete(self, model_id: str) -> list[str]:
        """Delete a model with every version; the version ids that were deleted."""
        versions = self.versions.list(model_id)

        def forget() -> None:
            with self.db.transaction() as conn:
                conn.execute("DELETE FROM versions WHERE model = ?", (model_id,))
                conn.execute("DELETE FROM models WHERE id = ?", (model_id,))

        def remove() -> None:
            for version in versions:
                shutil.rmtree(version.path, ignore_errors=True)

        delete_freeing_space(forget, remove, self.reserve)
        return [v.id for v in versions]



def _lineage(directory: Path) -> dict:
    config = json.loads((directory / "adapter_config.json").read_text())
    return {"adapter_sha256": file_sha256(directory / "adapter_model.safetensors"),
            "peft_config": config}


def validate(directory: Path, base: Shapes | None = None) -> str:
    """The PEFT type of an adapter directory, or AdapterError saying what is wrong: its config,
    its safetensors file's table of tensors (the header only: the data is never read, so a
    large upload costs the manager's loop no more than a small one), and its tensors against
    the config and the `base` model's weight shapes."""
    for filename in FILES:
        if not (directory / filename).is_file():
            raise AdapterError(f"an adapter directory needs {filename}",
                               filename.partition(".")[0])
    try:
        config = json.loads((directory / "adapter_config.json").read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise AdapterError(f"adapter_config.json is not valid JSON: {exc}",
                           "adapter_config") from None
    if not isinstance(config, dict):
        raise AdapterError("adapter_config.json must hold a JSON object, not "
                           f"{type(config).__name__}", "adapter_config")
    peft_type = str(config.get("peft_type", "")).upper()
    if peft_type not in SUPPORTED:
        raise AdapterError(f"peft_type {peft_type or 'missing'!r} is not supported "
                           f"(supported: {', '.join(sorted(SUPPORTED))})", "adapter_config")
    if config.get("use_dora"):
        raise AdapterError("DoRA adapters need the base weights and cannot be served",
                           "adapter_config")
    try:
        tensors = read_shapes(directory / "adapter_model.safetensors")
        check(peft_type, config, tensors, base)
    except (TensorFileError, AdapterMismatch) as exc:
        raise AdapterError(str(exc)) from None
    return peft_type
